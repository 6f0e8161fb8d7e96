"""Engines around the planner, all leaves of the import graph and all optional.

Engine-neutral modules import neither torch nor JAX: plan export to JAX shardings and DTensor
placements (``export``), the numpy interpreter and virtual-device executor (``interpret``,
``executor``), the HLO reader (``hlo``), the cost model's predicted collectives (``predicted``),
the verifier (``verify``) and the job launcher every engine run goes through (``jobs``). The
PyTorch engine lives in ``engines.torch``, the JAX engine in ``engines.jax``; neither imports the
other (``tests/test_layout.py``).
"""
