"""What the exact search falls back on and reasons with before it solves: the topological greedy
plan (the solution hint, and the answer when the time limit is too short), the separable lower
bound, the least memory any plan needs and why nothing fits, and the size of the program."""

from __future__ import annotations

import math
import time
from typing import Mapping, Sequence

import numpy as np

from planner.cost.problem import Problem
from planner.search.result import SolveResult
from planner.units import bytes_text


def greedy_choice(problem: Problem, memory_limit: float = math.inf) -> tuple[int, ...]:
    """Topological greedy: each op takes its cheapest strategy given its producers' choices.

    If the result does not fit ``memory_limit``, every op falls back to its least-memory strategy.
    """
    incoming: dict[int, list] = {}
    for edge in problem.all_edges:
        incoming.setdefault(edge.dst, []).append(edge)
    choice: list[int] = []
    for i, table in enumerate(problem.ops):
        total = table.cost.astype(np.int64).copy()
        for edge in incoming.get(i, ()):
            row = edge.cost[edge.src_index[choice[edge.src]]]
            total += row[edge.dst_index]
        choice.append(int(np.argmin(total)))
    if problem.memory(choice) > memory_limit:
        choice = [int(np.argmin(t.memory)) for t in problem.ops]
    return tuple(choice)


# measured: 279k Booleans (gpt2-medium, 2x4) built in 2.2 s on 2 cores
BUILD_SECONDS_PER_BOOLEAN = 1e-5
# measured: CP-SAT took 0.55-0.77 s to stop at a 0.01 s limit on those 279k
LOAD_SECONDS_PER_BOOLEAN = 3e-6


def program_size(problem: Problem, allowed: Mapping[int, Sequence[int]] | None = None) -> int:
    """Booleans of the program: strategies, plus layout pairs of edges with several layouts at both
    ends."""

    def layouts(op: int, index: np.ndarray, distinct: int) -> int:
        return (
            len(set(index[list(allowed[op])].tolist())) if allowed and op in allowed else distinct
        )

    pairs = 0
    for e in problem.all_edges:
        a, b = (
            layouts(e.src, e.src_index, len(e.src_layouts)),
            layouts(e.dst, e.dst_index, len(e.dst_layouts)),
        )
        pairs += a * b if a > 1 and b > 1 else 0
    return pairs + sum(
        len(allowed[i]) if allowed and i in allowed else len(t.strategies)
        for i, t in enumerate(problem.ops)
    )


def build_seconds(problem: Problem, allowed: Mapping[int, Sequence[int]] | None = None) -> float:
    """Estimated time to build the CP-SAT model (it is Python, so it is not interruptible by
    CP-SAT's limit)."""
    return BUILD_SECONDS_PER_BOOLEAN * program_size(problem, allowed)


def separable_bound(problem: Problem) -> int:
    """A proven lower bound on the objective: every operator and every edge at its own minimum."""
    return int(
        sum(int(t.cost.min()) for t in problem.ops)
        + sum(int(e.cost.min()) for e in problem.all_edges)
    )


def too_short(
    problem: Problem, memory_limit: float, hint, lower_bound, start: float
) -> SolveResult:
    """The time limit cannot even cover building the model: the greedy plan, with the separable
    bound."""
    choice = tuple(hint) if hint is not None else greedy_choice(problem, memory_limit)
    build = build_seconds(problem)
    why = f"time limit shorter than building the CP-SAT model (about {build:.0f} s): greedy plan"
    return hint_result(
        problem,
        memory_limit,
        choice,
        max(separable_bound(problem), lower_bound or 0),
        start,
        0,
        why,
    )


def greedy_result(problem: Problem, memory_limit: float, start: float) -> SolveResult:
    """The greedy plan as a FEASIBLE result with the separable bound (UNKNOWN if it does not
    fit)."""
    return hint_result(
        problem,
        memory_limit,
        greedy_choice(problem, memory_limit),
        separable_bound(problem),
        start,
        0,
        "greedy plan",
    )


def hint_result(
    problem: Problem,
    memory_limit: float,
    hint: Sequence[int],
    bound: int,
    start: float,
    num_booleans: int,
    why: str,
) -> SolveResult:
    """The solution hint as the result of a search the time limit stopped (UNKNOWN if it does not
    fit)."""
    if problem.memory(hint) > memory_limit:
        return SolveResult.no_plan(
            "UNKNOWN",
            f"{why}, and the greedy hint does not fit the memory limit",
            time.perf_counter() - start,
            num_booleans,
        )
    return SolveResult(
        "FEASIBLE",
        problem.objective(hint),
        bound,
        tuple(hint),
        time.perf_counter() - start,
        num_booleans,
        why,
    )


def min_memory(problem: Problem) -> int:
    """Least memory per device any plan needs (memory is separable per operator)."""
    return int(sum(int(t.memory.min()) for t in problem.ops))


def explain_infeasible(problem: Problem, memory_limit: float, need: float | None = None) -> str:
    """Why nothing fits: the least memory any plan needs (``need``; default the problem's own, under
    its settings) against the limit, and the levers not already given (``auto`` tries them all)."""
    need = min_memory(problem) if need is None else need
    settings = problem.settings
    levers = ["more devices"]
    if settings.recompute == "auto":
        pass  # every recompute mode was tried per layer
    elif settings.recompute != "full":
        levers.append("--recompute full")
    if settings.zero == "auto":
        pass
    elif settings.zero != 3:
        levers.append("--zero 1/2/3" if settings.zero == 0 else "--zero 3")
    levers.append("--pipeline auto")
    return (
        f"memory: the plan needs at least {bytes_text(need)} per device but the limit is "
        f"{bytes_text(memory_limit)}; try {', '.join(levers[:-1])} or {levers[-1]}"
    )
