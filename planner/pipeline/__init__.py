"""Pipeline planning: schedules and the layer-chain cost model (``schedule``), the searches over
stage cuts and micro-batch counts (``search``: exact DP, brute force, CSIMD, baselines), and 3D
plans that combine them with exact intra-operator plans per stage (``threed``)."""
