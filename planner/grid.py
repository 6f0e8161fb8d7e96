"""The practitioner's baseline: Megatron-LM configurations tried one by one, as people tune them by
grid search, each costed by the same model as every other method.

    grid  = { (tensor axis t, mode m) :  t in {none} + mesh axes,
                                          m in the uniform (recompute, ZeRO stage) modes the
                                            settings leave open (``auto``: every mode; a fixed
                                            setting: that one) }
    plan  = argmin over the grid of objective(megatron(t) under m)
            among the points whose memory fits (none fits: the least memory)

t = none is data parallelism on every axis; otherwise Megatron-LM's tensor parallelism on axis t
and data parallelism on the others (``baselines.megatron``). With ``--pipeline auto`` the 3D
search adds the pipeline degree, the micro-batch count, sequence parallelism and the uniform
settings around it. Every grid point is a plan the exact search may also choose (its strategies
and uniform per-layer modes are in the exact search's space), so the grid is never better than an
OPTIMAL exact plan.
"""

from __future__ import annotations

from dataclasses import replace

from planner.cost.problem import Problem
from planner.plans import Plan, make_plan
from planner.search.baselines import data_parallel, megatron
from planner.search.layer_modes import layer_options


def megatron_grid(problem: Problem, memory_limit: float) -> Plan:
    """The best grid point as a HEURISTIC plan (costed under its mode), its notes saying what the
    grid tried and chose."""
    options = layer_options(problem, ())
    points = []
    for mode, variant in zip(options.modes, (problem, *options.variants)):
        for axis in (None, *range(len(problem.mesh.axes))):
            if axis is not None and problem.mesh.axes[axis].size == 1:
                continue
            strategies = data_parallel(variant) if axis is None else megatron(variant, axis)
            plan = make_plan(
                variant,
                strategies,
                method="megatron-grid",
                status="HEURISTIC",
                memory_limit=memory_limit,
            )
            rank = plan.objective if plan.fits_memory else plan.memory_per_device_bytes
            points.append((not plan.fits_memory, rank, len(points), mode, axis, plan))
    _, _, _, mode, axis, best = min(points, key=lambda p: p[:3])
    where = "none (data parallel)" if axis is None else problem.mesh.axes[axis].name
    said = f"Megatron grid: {len(points)} configurations tried, tensor parallel on {where}"
    if len(options.modes) > 1:
        said += f", recompute {mode[0]} and ZeRO stage {mode[1]} on every layer"
    if all(p[0] for p in points):
        said += "; none fits the memory limit: the one of least memory"
    return replace(best, notes=(said, *best.notes))
