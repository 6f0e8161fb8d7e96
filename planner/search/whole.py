"""The whole-graph program when recompute or ZeRO is chosen per layer (``auto``).

The CP-SAT program of ``planner.search.solver`` costs every operator under one set of settings, so
it cannot mix modes layer by layer as the Pareto master does. When the exact search falls back to
it (no single-tensor cut, the segments ran out of time, too many tied layouts), each uniform mode
m = (recompute, ZeRO stage) is solved as its own program, every layer in m, and the best plan wins:

    plan = argmin over m of  OPT_m        (each OPT_m within its share of the time limit)

That plan honours ``auto`` (it is the best uniform choice, not the no-recompute, stage-0 plan),
but a mix of modes could be cheaper, so its status is FEASIBLE, with no bound on the mixed problem.
"""

from __future__ import annotations

import time

from planner.cost.problem import Problem
from planner.search.layer_modes import layer_options, pinned_settings
from planner.search.fallback import program_size
from planner.search.result import SolveResult
from planner.search.solver import solve

MAX_WHOLE_PROGRAM = 2_000_000  # Booleans: past this the whole-graph program is not built


def solve_whole(
    problem: Problem, memory_limit: float, time_limit_s: float, seed: int
) -> tuple[SolveResult, tuple[str, ...]]:
    """The whole-graph program; under recompute / zero ``auto`` the best uniform mode (see
    above)."""
    options = layer_options(problem, ())
    if not options.variants:
        return solve(problem, memory_limit, time_limit_s, seed), ()
    start = time.perf_counter()
    layers = sorted({op.layer for op in problem.graph.operators if op.layer is not None})
    best, best_mode = None, None
    for n, (mode, option) in enumerate(zip(options.modes, (problem, *options.variants))):
        left = time_limit_s - (time.perf_counter() - start)
        result = solve(option, memory_limit, max(left / (len(options.modes) - n), 1e-3), seed)
        if result.choice is not None and (best is None or result.objective < best.objective):
            best, best_mode = result, mode
    elapsed = time.perf_counter() - start
    tried = f"{len(options.modes)} uniform (recompute, ZeRO stage) modes tried"
    if best is None:
        why = f"the whole-graph program found no plan in any of the {tried}"
        return SolveResult.no_plan("UNKNOWN", why, elapsed), (tried,)
    chosen = pinned_settings(problem.settings, layers, best_mode)
    note = (
        f"the whole-graph program cannot mix modes per layer: {tried}, the best is recompute "
        f"{best_mode[0]} and ZeRO stage {best_mode[1]} on every layer (a mix may be cheaper)"
    )
    return SolveResult(
        "FEASIBLE",
        best.objective,
        None,
        best.choice,
        elapsed,
        best.num_booleans,
        layer_recompute=chosen.layer_recompute,
        layer_zero=chosen.layer_zero,
    ), (note,)


def whole_instead(
    problem: Problem,
    memory_limit: float,
    deadline: float,
    seed: int,
    start: float,
    notes: tuple[str, ...],
    why: str,
) -> tuple[SolveResult, tuple[str, ...]]:
    """The segments took their share of the time limit: the whole-graph program gets the rest."""
    left = max(0.0, deadline - time.perf_counter())
    if program_size(problem) > MAX_WHOLE_PROGRAM:
        return SolveResult.no_plan(
            "UNKNOWN",
            f"{why}; the whole-graph program is too large to build instead",
            time.perf_counter() - start,
        ), notes
    result, said = solve_whole(problem, memory_limit, left, seed)
    return result, notes + (
        f"{why}: solved as one whole-graph program in the {left:.1f} s left",
    ) + said
