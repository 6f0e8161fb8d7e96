"""The exact planner of record: decomposition when the graph has cuts, memory kept exact.

    unconstrained:  reduce every distinct segment once (planner.eliminate), multiply the tables
                    (planner.decompose); the result is the whole-graph optimum.
    memory binds:   Lagrangian relaxation, since memory is additive over operators:
                        L(lam) = min_x c(x) + lam * (m(x) - M)  <=  OPT   for every lam >= 0,
                    each L(lam) solved exactly by the same decomposition with unary costs
                    c + lam * m. Bisection on lam keeps the best feasible plan x_f and the best
                    bound; if ceil(L) >= c(x_f) the plan is OPTIMAL with that certificate. Otherwise
                    CP-SAT solves the whole program with x_f as hint and c >= ceil(L) as a cut, and
                    its status (OPTIMAL or FEASIBLE at the time limit) is reported.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from planner.decompose import Segment, group_blocks, product_block, segment_network, split_segments
from planner.problem import Problem
from planner.solver import SolveResult, explain_infeasible, min_memory, solve

Progress = Callable[[int, int, str], None]
LAGRANGE_ITERATIONS = 40
MAX_WHOLE_PROGRAM = 2_000_000


@dataclass(frozen=True, slots=True)
class DecomposedSolution:
    value: float
    choice: tuple[int, ...]


def _reduce(problem: Problem, seg: Segment, unary: Sequence[np.ndarray]):
    net, entry, exit_ = segment_network(problem, seg, unary)
    return net.reduce(entry, exit_)


_WORKER: dict = {}  # per worker process: the problem, sent once by the pool initializer


def _init_worker(problem: Problem) -> None:
    _WORKER["problem"] = problem


def _reduce_in_worker(seg: Segment, unary: Sequence[np.ndarray]):
    return _reduce(_WORKER["problem"], seg, unary)


def solve_unary(problem: Problem, segments: Sequence[Segment], unary: Sequence[np.ndarray], jobs: int = 1,
                progress: Progress | None = None) -> DecomposedSolution:
    """Exact minimum of sum(unary) + edge costs: distinct segments reduced once, tables multiplied."""
    distinct: dict[str, Segment] = {}
    for seg in segments:
        distinct.setdefault(seg.key, seg)
    reductions = {}
    items = list(distinct.items())
    if jobs > 1 and len(items) > 1:
        with ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, initargs=(problem,)) as pool:
            futures = [(key, pool.submit(_reduce_in_worker, seg, unary)) for key, seg in items]
            for n, (key, fut) in enumerate(futures):
                reductions[key] = fut.result()
                if progress:
                    progress(n + 1, len(items), "segments")
    else:
        for n, (key, seg) in enumerate(items):
            reductions[key] = _reduce(problem, seg, unary)
            if progress:
                progress(n + 1, len(items), "segments")
    blocks = group_blocks(segments, [reductions[s.key].table for s in segments])
    top = product_block(blocks)
    value = float(top.table[0, 0])
    states = top.boundaries(0, 0)
    choice = [-1] * len(problem.ops)
    for k, seg in enumerate(segments):
        red = reductions[seg.key]
        local = red.recover(states[k], states[k + 1], len(seg.ops) + 2)
        for n, op in enumerate(seg.ops):
            choice[op] = local[n]
    return DecomposedSolution(value, tuple(choice))


def solve_exact(problem: Problem, memory_limit: float | None = None, time_limit_s: float = 60.0, seed: int = 0,
                jobs: int = 1, progress: Progress | None = None) -> tuple[SolveResult, tuple[str, ...]]:
    """The exact planner: decomposed when the graph has cuts, else the whole-graph program."""
    start = time.perf_counter()
    segments = split_segments(problem)
    if len(segments) <= 1:
        result = solve(problem, memory_limit, time_limit_s, seed)
        return result, ("no single-tensor cut: solved as one whole-graph program",)
    distinct = len({s.key for s in segments})
    notes = (f"decomposed into {len(segments)} segments ({distinct} distinct)",)
    if memory_limit is not None and min_memory(problem) > memory_limit:
        return SolveResult("INFEASIBLE", None, None, None, time.perf_counter() - start, 0,
                           explain_infeasible(problem, memory_limit)), notes
    costs = [t.cost.astype(np.float64) for t in problem.ops]
    free = solve_unary(problem, segments, costs, jobs, progress)
    objective = problem.objective(free.choice)
    assert objective == int(round(free.value)), "decomposed value disagrees with the integer objective"
    if memory_limit is None or problem.memory(free.choice) <= memory_limit:
        return SolveResult("OPTIMAL", objective, objective, free.choice, time.perf_counter() - start, 0), notes
    return _lagrangian(problem, segments, memory_limit, time_limit_s, seed, jobs, start, notes)


def _lagrangian(problem: Problem, segments: Sequence[Segment], memory_limit: float, time_limit_s: float,
                seed: int, jobs: int, start: float, notes: tuple[str, ...]) -> tuple[SolveResult, tuple[str, ...]]:
    costs = [t.cost.astype(np.float64) for t in problem.ops]
    mems = [t.memory.astype(np.float64) for t in problem.ops]
    best: tuple[int, tuple[int, ...]] | None = None
    bound = -math.inf
    seen: list[set[int]] = [set() for _ in problem.ops]

    def at(lam: float) -> bool:
        nonlocal best, bound
        sol = solve_unary(problem, segments, [c + lam * m for c, m in zip(costs, mems)], jobs)
        for i, s in enumerate(sol.choice):
            seen[i].add(s)
        memory = problem.memory(sol.choice)
        bound = max(bound, sol.value - lam * memory_limit)
        if memory <= memory_limit:
            value = problem.objective(sol.choice)
            if best is None or value < best[0]:
                best = (value, sol.choice)
            return True
        return False

    _bisect_price(at, costs, mems, lambda: best is not None and _certified(best[0], bound))
    lower = _ceil_bound(bound)
    if best is not None and _certified(best[0], bound):
        notes += (f"memory binds: Lagrangian certificate (bound {lower} = objective)",)
        return SolveResult("OPTIMAL", best[0], lower, best[1], time.perf_counter() - start, 0), notes
    # Restricted master: the whole program over the strategies the priced solutions used, so that
    # CP-SAT can mix them layer by layer under the memory limit.
    remaining = lambda: max(1.0, time_limit_s - (time.perf_counter() - start))
    master = solve(problem, memory_limit, min(remaining(), time_limit_s / 2), seed, hint=best[1] if best else None,
                   allowed={i: sorted(s) for i, s in enumerate(seen)})
    if master.choice is not None and (best is None or master.objective < best[0]):
        best = (master.objective, master.choice)
    if best is not None and _certified(best[0], bound):
        notes += (f"memory binds: restricted master certified by the Lagrangian bound {lower}",)
        return SolveResult("OPTIMAL", best[0], lower, best[1], time.perf_counter() - start, 0), notes
    if program_size(problem) > MAX_WHOLE_PROGRAM:
        notes += (f"memory binds: best plan within {_gap(best, lower)} of the Lagrangian bound {lower}; the whole "
                  f"program ({program_size(problem)} Booleans) is too large to close the gap",)
        return SolveResult("FEASIBLE" if best else "UNKNOWN", best[0] if best else None, lower,
                           best[1] if best else None, time.perf_counter() - start, 0), notes
    result = solve(problem, memory_limit, remaining(), seed, hint=best[1] if best else None, lower_bound=lower)
    notes += (f"memory binds: gap to the Lagrangian bound {lower} closed by CP-SAT on the whole program",)
    if result.choice is None or (best is not None and result.objective > best[0]):
        status = "OPTIMAL" if result.status == "OPTIMAL" else ("FEASIBLE" if best else result.status)
        result = SolveResult(status, best[0] if best else None, lower, best[1] if best else None,
                             result.search_time_s, result.num_booleans)
    return SolveResult(result.status, result.objective, result.bound, result.choice, time.perf_counter() - start,
                       result.num_booleans, result.explanation), notes


def _bisect_price(at: Callable[[float], bool], costs, mems, done: Callable[[], bool]) -> None:
    """Find a feasible price by doubling, then bisect between infeasible and feasible prices."""
    scale = max(1.0, sum(float(c.max()) for c in costs)) / max(1.0, sum(float(m.max()) for m in mems))
    low, high = 0.0, scale
    for _ in range(80):
        if at(high):
            break
        low, high = high, high * 4
    for _ in range(LAGRANGE_ITERATIONS):
        if done():
            return
        mid = 0.5 * (low + high)
        if at(mid):
            high = mid
        else:
            low = mid


def program_size(problem: Problem) -> int:
    """Booleans of the whole-graph program (strategies plus layout pairs of multi-layout edges)."""
    pairs = sum(len(e.src_layouts) * len(e.dst_layouts) for e in problem.edges
                if len(e.src_layouts) > 1 and len(e.dst_layouts) > 1)
    return pairs + sum(len(t.strategies) for t in problem.ops)


def _gap(best: tuple[int, tuple[int, ...]] | None, lower: int) -> str:
    return f"{100.0 * (best[0] - lower) / max(1, lower):.2f}%" if best else "n/a"


def _ceil_bound(bound: float) -> int:
    # Float sums of up to ~1e4 integer-valued terms: allow a relative rounding slack.
    return int(math.ceil(bound - 1e-9 * abs(bound) - 1e-6))


def _certified(objective: int, bound: float) -> bool:
    return objective <= _ceil_bound(bound)
