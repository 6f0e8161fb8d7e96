"""The symbolic cost model and the costed problem.

``settings`` (what a training step does), ``strategy`` (strategies and the layouts they imply),
``collectives`` (ring formulas), ``records`` (volumes and their seconds), ``redistribution`` (layout
changes and edge costs), ``operators`` (one operator under one strategy), ``terms`` (the one walk
that costs a whole plan) and ``problem`` (every operator's strategies and every edge's layout table
in integer units: the object all searches work on)."""
