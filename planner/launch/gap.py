"""How far a user's launch configuration is from the best one on the same GPUs, and the few
changes that close most of the gap (``planner evaluate --from-megatron/--from-torchtitan
--compare-best``).

    searched = the 3D search for the engine the line came from (``planner.launch.plan_for``:
               Megatron-LM's stage plans at every tensor degree of a node, or none, keeping only
               what the engine runs as costed) on node=W/g,gpu=g (W the world size, g GPUs
               per node), the same model, global batch and schedule: the best
               configuration the engine can launch (degrees, cuts, micro-batches, recompute,
               ZeRO stage, sequence parallelism), each candidate costed by the same model as the
               user's
    best     = the faster of searched and the given configuration where the given one fits (the
               3D search is HEURISTIC: a best the given line beats is never reported)
    changes  = greedily, the change group (degrees and cuts, micro-batch, recompute, ZeRO stage,
               sequence parallelism) that, moved from the user's value to the best's, lowers the
               iteration time most while the configuration still fits; until no move lowers it.
               A given line that does not fit: the first change is the fastest that makes it fit
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path


from planner.cluster.profiles import DEFAULT_HARDWARE_CSV, MachineProfile, get_profile
from planner.launch.run import LaunchRun
from planner.launch.megatron import even_cuts, shell_line
from planner.errors import SettingsError
from planner.launch.targets import launch_run, plan_data, plan_for, recost
from planner.pipeline.plan3d import Plan3D

GROUPS = ("degrees", "micro_batch", "recompute", "zero", "sequence_parallel")


@dataclass(frozen=True, slots=True)
class Change:
    """One change group moved to the best configuration's value, and the time after it."""

    group: str
    before: str
    after: str
    iteration_time_s: float


@dataclass(frozen=True, slots=True)
class Gap:
    """The user's configuration against the best Megatron-LM configuration on the same GPUs."""

    given: Plan3D
    best: Plan3D
    changes: tuple[Change, ...]
    searched: Plan3D  # the 3D search's answer (``best`` unless the given line is faster)
    best_line: str = ""  # the best configuration as a Megatron-LM launch line

    @property
    def best_is_given(self) -> bool:
        return self.best is self.given

    @property
    def percent(self) -> float:
        """How much longer the given iteration is than the best one (%)."""
        return 100.0 * (
            self.given.pipeline.iteration_time_s / self.best.pipeline.iteration_time_s - 1.0
        )

    def lines(self) -> list[str]:
        best = self.best.pipeline
        if self.best_is_given:
            searched = self.searched.pipeline.iteration_time_s
            return [
                f"the given configuration is the fastest found: {best.iteration_time_s:.3f} s per "
                f"iteration; the 3D search's best Megatron-LM configuration on these GPUs takes "
                f"{searched:.3f} s ({100 * (searched / best.iteration_time_s - 1):+.1f}%)"
            ]
        fits = "" if self.given.fits_memory else " and does not fit (the first change fits it)"
        out = [
            f"best Megatron-LM configuration the 3D search finds on these GPUs: "
            f"{best.iteration_time_s:.3f} s per iteration ({best.stages} stages of "
            f"{self.best.stage_mesh}, {best.num_microbatches} micro-batches); the given one takes "
            f"{self.percent:+.1f}%{fits}; the changes that lower the time, best first:"
        ]
        start = self.given.pipeline.iteration_time_s
        for change in self.changes:
            share = 100 * (change.iteration_time_s / start - 1)
            out.append(
                f"  {change.group}: {change.before} -> {change.after}: "
                f"{change.iteration_time_s:.3f} s ({share:+.1f}%)"
            )
        if not self.changes:
            out.append("  none: no single change towards it lowers the time")
        if self.best_line:
            out.append(f"the best as a launch line: {self.best_line}")
        return out


def compare_best(
    run: LaunchRun,
    given: Plan3D,
    device: str | MachineProfile = "a100-80g",
    memory: float | None = None,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
    engine: str = "megatron",
) -> Gap:
    """The gap of ``run`` (costed as ``given``) to the best configuration ``engine`` runs (the
    search of ``planner.launch.plan_for``: its answer exports to the engine)."""
    profile = get_profile(device, hardware_csv) if isinstance(device, str) else device
    nodes, per_node = run.nodes(profile.gpus_per_node)
    searched = plan_for(
        engine,
        run.model_spec,
        f"node={nodes},gpu={per_node}",
        profile,
        batch=run.global_batch,
        memory=memory,
        # the user's dtype, optimizer, overlap, buckets and gradients; the search decides the rest
        settings=replace(
            run.settings, recompute="none", layer_recompute=(), zero=0, sequence_parallel=False
        ),
        schedule=run.schedule,
        hardware_csv=hardware_csv,
    )
    faster = given.pipeline.iteration_time_s < searched.pipeline.iteration_time_s
    if given.fits_memory and faster:
        return Gap(given, given, (), searched)
    target = launch_run(plan_data(searched, run.model_spec, None))
    changes = _changes(run, target, profile, memory, hardware_csv)
    line = shell_line(target, per_node) if engine == "megatron" else ""
    return Gap(given, searched, changes, searched, line)


def _changes(run: LaunchRun, target: LaunchRun, device, memory, hardware_csv) -> tuple:
    """Greedy: each step moves the group whose move lowers the time most (and still fits)."""
    left = [g for g in GROUPS if _value(run, g) != _value(target, g)]
    current, changes = run, []
    given = recost(run, device, memory, hardware_csv)
    # a line that does not fit: any change that makes it fit is advice, the fastest first
    start = given.pipeline.iteration_time_s if given.fits_memory else float("inf")
    while left:
        trials = []
        for group in left:
            moved = _moved(current, target, group)
            try:
                plan = recost(moved, device, memory, hardware_csv)
            except SettingsError:  # e.g. a micro-batch the old degrees do not divide
                continue
            if plan.fits_memory:
                trials.append((plan.pipeline.iteration_time_s, group, moved))
        if not trials:
            break
        time_s, group, moved = min(trials, key=lambda t: t[0])
        if time_s >= (changes[-1].iteration_time_s if changes else start):
            break  # no move left lowers the time: the rest are not recommended
        changes.append(Change(group, _value(current, group), _value(target, group), time_s))
        current, left = moved, [g for g in left if g != group]
    return tuple(changes)


def _value(run: LaunchRun, group: str) -> str:
    if group == "degrees":
        even = run.cuts is None or run.cuts == even_cuts(run.model.layers, run.pipeline_parallel)
        cuts = "even" if even else ",".join(map(str, run.cuts))
        return (
            f"tp {run.tensor_parallel}, pp {run.pipeline_parallel}, dp {run.data_parallel}, "
            f"cuts {cuts}"
        )
    if group == "micro_batch":
        return str(run.micro_batch)
    if group == "recompute" and run.settings.layer_recompute:  # Megatron-LM's block recompute
        full = sum(mode == "full" for _, mode in run.settings.layer_recompute)
        return f"full on {full} of {len(run.settings.layer_recompute)} layers"
    return str(getattr(run.settings, group))


def _moved(run: LaunchRun, target: LaunchRun, group: str) -> LaunchRun:
    if group == "degrees":
        return replace(
            run,
            tensor_parallel=target.tensor_parallel,
            pipeline_parallel=target.pipeline_parallel,
            data_parallel=target.data_parallel,
            cuts=target.cuts,
        )
    if group == "micro_batch":
        return replace(run, micro_batch=target.micro_batch)
    moved = {group: getattr(target.settings, group)}
    if group == "recompute":  # the target's one mode replaces any per-layer modes
        moved["layer_recompute"] = target.settings.layer_recompute
    return replace(run, settings=replace(run.settings, **moved))
