"""Pictures and tables of a plan (``planner show``): where the time goes (the schedule of one
iteration, or the step split into compute and collectives), where the memory goes (per stage,
against the device limit) and how each layer is sharded (a grid of operators by mesh axis). Drawn
with matplotlib (the ``plot`` extra) from the plan JSON alone; ``--text`` prints the same tables."""
