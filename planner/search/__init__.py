"""Searches over a costed ``Problem``: the CP-SAT program (``solver``), series-parallel elimination
(``eliminate``), the homomorphism decomposition (``decompose``), Pareto fronts of (cost, memory)
(``fronts``) and the exact master under a memory limit (``pareto``), the exact planner of record
with its Lagrangian fallback (``exact``), the heuristic baselines (``baselines``) and brute force
(``brute``)."""
