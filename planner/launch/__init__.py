"""Launch configurations: plans to and from the engines that run them.

One package, one registry (``TARGETS`` in ``targets.py``): an engine is a writer (a 3D plan as its
configuration), a reader (its configuration costed as given) and one ``Target`` entry; a third
engine is one module and one registration.

    run.py              LaunchRun: one configuration to launch, whatever the engine
    targets.py          the registry, the exports (checked by re-costing the configuration read
                        back), the readers' evaluation, and ``plan_for`` (the whole-cluster
                        search restricted to what one engine runs: ``planner plan --for``)
    megatron.py         a LaunchRun as Megatron-LM arguments; megatron_read.py reads a line back
                        (megatron_model.py: its model and vocabulary; megatron_flags.py: inert,
                        legacy and DeepSpeed flags; shell_script.py: a script expanded as bash
                        would)
    torchtitan.py       a LaunchRun as a torchtitan config; torchtitan_read.py reads one back
    gap.py              how far a launch line is from the best its engine runs (--compare-best)
"""

from planner.launch.targets import (
    TARGETS,
    LaunchExport,
    Target,
    evaluate_megatron,
    evaluate_torchtitan,
    export_megatron,
    export_torchtitan,
    launch_run,
    plan_data,
    plan_for,
    recost,
    target,
)

__all__ = [
    "TARGETS",
    "LaunchExport",
    "Target",
    "evaluate_megatron",
    "evaluate_torchtitan",
    "export_megatron",
    "export_torchtitan",
    "launch_run",
    "plan_data",
    "plan_for",
    "recost",
    "target",
]
