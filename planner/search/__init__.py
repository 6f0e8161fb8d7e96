"""Searches over a costed ``Problem``: the CP-SAT program (``solver``), series-parallel elimination
(``eliminate``), the homomorphism decomposition (``decompose``), the exact planner of record with
its Lagrangian memory pricing (``exact``), the heuristic baselines (``baselines``) and brute force
(``brute``)."""
