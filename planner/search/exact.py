"""The exact planner of record: decomposition when the graph has cuts, memory kept exact.

    unconstrained:  reduce every distinct segment once (planner.search.eliminate), multiply the tables
                    (planner.search.decompose); the result is the whole-graph optimum.
    memory binds:   the Pareto tables and label-setting master of ``planner.search.pareto``
                    (exact, OPTIMAL); if its fronts outgrow their caps or its share of the time
                    limit ends, Lagrangian relaxation, since memory is additive over operators:
                        L(lam) = min_x c(x) + lam * (m(x) - M)  <=  OPT   for every lam >= 0,
                    each L(lam) solved exactly by the same decomposition with unary costs
                    c + lam * m. Bisection on lam keeps the best feasible plan x_f and the best
                    bound; if ceil(L) >= c(x_f) the plan is OPTIMAL with that certificate. Otherwise
                    CP-SAT solves the whole program with x_f as hint and c >= ceil(L) as a cut, and
                    its status (OPTIMAL or FEASIBLE at the time limit) is reported.
    recompute / zero auto: when memory binds (zero: always, a stage can also save time), the graph
                    is costed with every layer in each (recompute mode, ZeRO stage) pair and the
                    Pareto master chooses a pair per layer with the strategies
                    (``planner.search.layer_modes``); the result's ``layer_recompute`` and
                    ``layer_zero`` hold the choice.
    tied parameters: one solve per layout of the owner (``planner.search.ties``), sharing the
                    reductions, variants and front tables of the segments the ties leave alone,
                    each later one pruned by the best plan so far (status DOMINATED inside).
"""

from __future__ import annotations

import math
import time
import multiprocessing
import os
import signal
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from planner.search.decompose import Segment, group_blocks, product_block, segment_network, split_segments
from planner.search.fronts import FrontTooLarge
from planner.search.pareto import Dominated, ParetoResult, Unproven, lagrangian_bound, pareto_search
from planner.search.prices import priced_bound
from planner.cost.problem import Problem
from planner.cost.settings import AUTO
from planner.search.layer_modes import LayerOptions, layer_modes, layer_options, least_memory
from planner.search.ties import solve_tied
from planner.search.whole import MAX_WHOLE_PROGRAM, solve_whole, whole_instead
from planner.search.solver import (SolveResult, build_seconds, explain_infeasible, greedy_result, min_memory,
                                   program_size, separable_bound, solve)

Progress = Callable[[int, int, str], None]
LAGRANGE_ITERATIONS = 40
GREEDY_FALLBACK_OPS = 10_000  # past the time limit the greedy plan is built only where it is cheap
# (measured: 13 s on a 100k-operator chain, which would double a 10 s limit)
PARETO_SHARE = 0.5  # of the time limit: the Pareto master's; the Lagrangian path keeps the rest.
# Beside a plan in hand (another tied condition's) the master settles a condition (proves it dominated)
# sooner than the Lagrangian path and gets it all; with per-layer choices a cut master's bound is kept
# and the second sweep of the conditions settles it faster (measured: 41.6 s against 56.8 s)
REDUCE_SHARE = 0.5  # of the time limit: reducing the segments; past it, the whole-graph program gets the rest


@dataclass(frozen=True, slots=True)
class DecomposedSolution:
    value: float
    choice: tuple[int, ...]


def _reduce(problem: Problem, seg: Segment, unary: Sequence[np.ndarray], deadline: float | None = None):
    net, entry, exit_ = segment_network(problem, seg, unary)
    return net.reduce(entry, exit_, deadline=deadline)


_WORKER: dict = {}  # per worker process: the problem, sent once by the pool initializer


def _init_worker(problem: Problem) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool; no worker tracebacks
    _WORKER["problem"] = problem


def _reduce_in_worker(args):
    seg, unary, deadline = args
    return _reduce(_WORKER["problem"], seg, unary, deadline)


class Workers:
    """One pool of worker processes for a whole search (every price step reuses it).

    ``forkserver`` workers, since forking a process that has imported JAX is unsafe; at most one
    worker per CPU and per distinct segment. Terminated at once on an interrupt."""

    def __init__(self, problem: Problem, jobs: int, distinct: int) -> None:
        self.size = max(1, min(jobs, os.cpu_count() or 1, distinct))
        self.pool = None
        if self.size > 1:
            context = multiprocessing.get_context("forkserver")
            self.pool = context.Pool(self.size, initializer=_init_worker, initargs=(problem,))

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if self.pool is not None:
            if kind is None:
                self.pool.close()
            else:
                self.pool.terminate()
            self.pool.join()


def solve_unary(problem: Problem, segments: Sequence[Segment], unary: Sequence[np.ndarray],
                workers: Workers | None = None, progress: Progress | None = None,
                deadline: float | None = None, reduced: dict | None = None) -> DecomposedSolution:
    """Exact minimum of sum(unary) + edge costs: distinct segments reduced once, tables multiplied
    (``TimeoutError`` when a segment's reduction runs past ``deadline``). ``reduced`` keeps the
    reductions by segment key across calls whose unary costs are the problems' own op costs (the
    key hashes them): the tied-layout conditions share every segment they do not change."""
    distinct: dict[str, Segment] = {}
    for seg in segments:
        distinct.setdefault(seg.key, seg)
    known = reduced if reduced is not None else {}
    items = [(key, seg) for key, seg in distinct.items() if key not in known]
    if workers is not None and workers.pool is not None and len(items) > 1:
        results = workers.pool.imap(_reduce_in_worker, [(seg, unary, deadline) for _, seg in items])
    else:
        results = (_reduce(problem, seg, unary, deadline) for _, seg in items)
    reductions = {key: known[key] for key in distinct if key in known}
    for n, ((key, _), reduction) in enumerate(zip(items, results)):
        reductions[key] = known[key] = reduction
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
    """The exact planner: decomposed when the graph has cuts, else the whole-graph program; tied
    parameters conditioned on (``planner.search.ties``).

    ``time_limit_s`` bounds the whole call (price steps, model building and every CP-SAT solve);
    at the limit the best plan found is returned FEASIBLE with its proven bound."""
    started = time.perf_counter()
    result, notes = _solve_exact(problem, memory_limit, time_limit_s, seed, jobs, progress)
    if result.choice is None and result.status == "UNKNOWN" and len(problem.ops) <= GREEDY_FALLBACK_OPS:
        # as the whole-graph program does when its time is too short: the greedy plan, if it fits
        fallback = greedy_result(problem, memory_limit, started)
        if fallback.choice is not None:
            # a bound the search proved stands; under per-layer choices the greedy (no-choice) one does not
            bound = result.bound if result.bound is not None else \
                0 if AUTO in (problem.settings.recompute, problem.settings.zero) else fallback.bound
            why = f"the exact search found no plan in its time limit ({result.explanation}): the greedy plan"
            return replace(fallback, bound=bound, explanation=why), notes + (why,)
    return result, notes


def _solve_exact(problem: Problem, memory_limit: float | None, time_limit_s: float, seed: int, jobs: int,
                 progress: Progress | None) -> tuple[SolveResult, tuple[str, ...]]:
    if problem.ties:
        # shared by the conditions: what a segment the ties do not touch costs is worked out once
        memo: dict = {"reduced": {}, "variants": {}, "fronts": {}}
        relax = lambda untied, by: _relaxed(untied, memory_limit, memo, by)  # noqa: E731
        # one process: a worker pool per condition would start processes where an interrupt can land
        result, notes = solve_tied(problem, memory_limit, time_limit_s, seed, lambda untied, limit, incumbent:
                                   _solve_untied(untied, memory_limit, limit, seed, 1, progress, memo, incumbent), relax,
                                   solve_whole)
        return result, notes + ((f"--jobs {jobs}: tied parameters are solved in this process",) if jobs > 1 else ())
    return _solve_untied(problem, memory_limit, time_limit_s, seed, jobs, progress)


def _relaxed(problem: Problem, memory_limit: float | None, memo: dict, deadline: float) -> float:
    """A lower bound on the problem's optimum that orders and prunes the tied-layout conditions:
    the unconstrained optimum (recompute only adds time; not under ZeRO 'auto', where a stage may
    save time), and when memory binds the Lagrangian bound of the Pareto tables, which the exact
    search reuses. -inf past ``deadline``."""
    segments = split_segments(problem)
    bound = -math.inf
    if len(segments) <= 1 or time.perf_counter() >= deadline:
        return bound
    try:
        if problem.settings.zero != AUTO:
            costs = [t.cost.astype(np.float64) for t in problem.ops]
            free = solve_unary(problem, segments, costs, reduced=memo["reduced"], deadline=deadline)
            bound = free.value
            if memory_limit is None or problem.memory(free.choice) <= memory_limit:
                return bound  # it fits: the optimum itself (recompute 'auto' keeps it: recompute adds time)
        if memory_limit is None:
            return bound
        options = layer_options(problem, segments, memo)
        return max(bound, lagrangian_bound(problem, segments, memory_limit, deadline, variants=options.variants,
                                           units=options.units, tables=memo["fronts"]))
    except (TimeoutError, FrontTooLarge):
        return bound


def _solve_untied(problem: Problem, memory_limit: float | None, time_limit_s: float, seed: int, jobs: int,
                  progress: Progress | None, memo: dict | None = None,
                  incumbent: int | None = None) -> tuple[SolveResult, tuple[str, ...]]:
    start = time.perf_counter()
    deadline = start + time_limit_s
    segments = split_segments(problem) if time_limit_s > 0 else ()  # none left: cutting costs 2 s per 100k ops
    if time.perf_counter() >= deadline:
        return SolveResult("UNKNOWN", None, None, None, time.perf_counter() - start, 0,
                           f"the time limit ({time_limit_s:.1f} s left for the search) ended before any plan was "
                           "found: loading and costing the model took it all; raise --time-limit"), ()
    if len(segments) <= 1:
        result, said = solve_whole(problem, memory_limit, time_limit_s, seed)
        return result, ("no single-tensor cut: solved as one whole-graph program",) + said
    distinct = len({s.key for s in segments})
    notes = (f"decomposed into {len(segments)} segments ({distinct} distinct)",)
    options = None  # recompute / zero 'auto': the variants are built only when memory binds
    if memory_limit is not None and min_memory(problem) > memory_limit:
        options = layer_options(problem, segments, memo)
    if options is not None and least_memory(problem, options) > memory_limit:
        return SolveResult("INFEASIBLE", None, None, None, time.perf_counter() - start, 0,
                           explain_infeasible(problem, memory_limit, least_memory(problem, options))), notes
    with Workers(problem, jobs, distinct) as workers:
        if workers.size < jobs:
            notes += (f"--jobs {jobs}: {workers.size} worker(s) used (at most one per CPU and per distinct segment)",)
        costs = [t.cost.astype(np.float64) for t in problem.ops]
        began = time.perf_counter()
        try:
            free = solve_unary(problem, segments, costs, workers, progress, start + REDUCE_SHARE * time_limit_s,
                               memo and memo["reduced"])
        except TimeoutError as exc:
            return whole_instead(problem, memory_limit, deadline, seed, start, notes, str(exc))
        step_s = time.perf_counter() - began
        objective = problem.objective(free.choice)
        if objective != int(round(free.value)):
            raise RuntimeError(f"decomposed value {free.value} disagrees with the integer objective {objective}")
        fits = memory_limit is None or problem.memory(free.choice) <= memory_limit
        # recompute only adds time, so a plan that fits without it is optimal; a ZeRO stage may save time
        if fits and problem.settings.zero != AUTO:
            return SolveResult("OPTIMAL", objective, objective, free.choice, time.perf_counter() - start, 0), notes
        options = options or layer_options(problem, segments, memo)
        # no limit: one no plan can reach (finite, so that prices times memory stay numbers)
        limit = memory_limit if memory_limit is not None else 1.0 + max(
            sum(int(t.memory.max()) for t in p.ops) for p in (problem, *options.variants))
        share = 1.0 if incumbent is not None and not options.variants else PARETO_SHARE  # see PARETO_SHARE
        found, why, proven_bound = _pareto(problem, segments, limit, start + share * (deadline - start),
                                           options, memo and memo["fronts"], incumbent)
        if why.startswith("dominated"):  # no plan here beats another condition's (planner.search.ties)
            return SolveResult("DOMINATED", None, incumbent, None, time.perf_counter() - start, 0, why), notes + (why,)
        if found is None and fits:  # the choices could not be searched: the plan without them stands
            return SolveResult("OPTIMAL" if not options.variants else "FEASIBLE", objective, proven_bound,
                               free.choice, time.perf_counter() - start, 0), notes + (why,)
        why = why.replace("memory binds: ", "memory free: ", 1) if fits and found is not None else why
        if found is not None or (options.variants and proven_bound is not None):
            return _from_pareto(problem, segments, options, found, why, proven_bound, start), notes + (why,)
        if options.variants:
            why += "; choices per layer need the Pareto master: every layer runs without recompute at ZeRO stage 0"
        # its bound is the restricted problem's when layer choices exist: no proof against an incumbent then
        return _lagrangian(problem, segments, memory_limit, deadline, seed, workers, start, notes + (why,), step_s,
                           None if options.variants else incumbent, None if options.variants else proven_bound)


def _from_pareto(problem: Problem, segments: Sequence[Segment], options: "LayerOptions",
                 found: ParetoResult | None, why: str, proven_bound: int | None,
                 start: float) -> SolveResult:
    """The Pareto master's plan: OPTIMAL when proven, FEASIBLE with the Lagrangian bound when the
    master was cut after a beam pass; with per-layer choices and no plan, UNKNOWN with that bound
    (the Lagrangian path would search without the choices, and its bound would be the restricted
    problem's, no bound of this one)."""
    if found is None:
        return SolveResult("UNKNOWN", None, proven_bound, None, time.perf_counter() - start, 0, why)
    recompute, zero = layer_modes(problem, segments, found.modes, options)
    status, bound = ("OPTIMAL", found.objective) if proven_bound is None else ("FEASIBLE", proven_bound)
    return SolveResult(status, found.objective, bound, found.choice, time.perf_counter() - start, 0,
                       layer_recompute=recompute, layer_zero=zero)


def _pareto(problem: Problem, segments: Sequence[Segment], memory_limit: float, deadline: float,
            options: "LayerOptions", fronts: dict | None = None,
            incumbent: int | None = None) -> tuple[ParetoResult | None, str, int | None]:
    """The exact Pareto master: (plan, what was done, None) when proven optimal; (a beam plan or
    None, why the master stopped, the proven Lagrangian bound) when the master was cut; (None, why,
    None) when the tables could not be built or another condition's plan (``incumbent``) dominates."""
    try:
        found = pareto_search(problem, segments, memory_limit, deadline, variants=options.variants,
                              units=options.units, tables=fronts, incumbent=incumbent)
    except Dominated as exc:
        return None, f"dominated: {exc}", None
    except Unproven as exc:
        chosen = options.describe() if options.variants else ""
        if exc.plan is None:
            return None, f"memory binds: the exact Pareto master stopped ({exc}){chosen}", exc.bound
        gap = _gap((exc.plan.objective, ()), exc.bound)
        return exc.plan, (f"memory binds: the exact Pareto master stopped ({exc}); the best beam pass's plan, "
                          f"{gap} above the Lagrangian bound {exc.bound}{chosen}"), exc.bound
    except (FrontTooLarge, TimeoutError) as exc:
        return None, f"memory binds: Pareto tables stopped ({exc}); Lagrangian pricing and CP-SAT instead", None
    chosen = options.describe() if options.variants else ""
    return found, (f"memory binds: exact Pareto tables and label-setting master (fronts of up to "
                   f"{found.table_points} points, up to {found.max_labels} labels per layout; "
                   f"Lagrangian bound {found.lagrangian_bound}){chosen}"), None


def _lagrangian(problem: Problem, segments: Sequence[Segment], memory_limit: float, deadline: float, seed: int,
                workers: Workers, start: float, notes: tuple[str, ...],
                first_step_s: float = 0.0, incumbent: int | None = None,
                proven: int | None = None) -> tuple[SolveResult, tuple[str, ...]]:  # proven: the cut master's bound
    costs, mems = [t.cost.astype(np.float64) for t in problem.ops], [t.memory.astype(np.float64) for t in problem.ops]
    best: tuple[int, tuple[int, ...]] | None = None
    bound, seen = (-math.inf if proven is None else float(proven)), [set() for _ in problem.ops]
    step_s = [first_step_s]  # the longest price step so far: no step is started that cannot end by the deadline

    def at(lam: float) -> bool:
        nonlocal best, bound
        began = time.perf_counter()
        sol = solve_unary(problem, segments, [c + lam * m for c, m in zip(costs, mems)], workers)
        step_s[0] = max(step_s[0], time.perf_counter() - began)
        for i, s in enumerate(sol.choice):
            seen[i].add(s)
        memory = problem.memory(sol.choice)
        bound = max(bound, priced_bound(sol.value, lam * memory_limit, len(problem.ops) + len(problem.edges)))
        if memory <= memory_limit:
            value = problem.objective(sol.choice)
            if best is None or value < best[0]:
                best = (value, sol.choice)
            return True
        return False

    remaining = lambda: deadline - time.perf_counter()
    beaten = lambda: incumbent is not None and bound > incumbent  # noqa: E731 (another condition's plan wins)
    _bisect_price(at, costs, mems, lambda: (best is not None and _certified(best[0], bound)) or remaining() <= step_s[0]
                  or beaten())
    lower = _ceil_bound(bound) if math.isfinite(bound) else separable_bound(problem)  # no price step had time
    if beaten():
        return SolveResult("DOMINATED", None, incumbent, None, time.perf_counter() - start, 0, "dominated"), notes
    finish = lambda status, why: _finish(status, best, lower, start, notes + (why,))
    if best is not None and _certified(best[0], bound):
        return finish("OPTIMAL", f"memory binds: Lagrangian certificate (bound {lower} = objective)")
    allowed = {i: sorted(s) for i, s in enumerate(seen)}
    if remaining() > 0.5 + 2 * build_seconds(problem, allowed):
        # Restricted master: the whole program over the strategies the priced solutions used, so
        # that CP-SAT can mix them layer by layer under the memory limit.
        master = solve(problem, memory_limit, remaining() / 2, seed, hint=best[1] if best else None,
                       allowed=allowed, deadline=deadline)
        if master.choice is not None and (best is None or master.objective < best[0]):
            best = (master.objective, master.choice)
        if best is not None and _certified(best[0], bound):
            return finish("OPTIMAL", f"memory binds: restricted master certified by the Lagrangian bound {lower}")
    if program_size(problem) > MAX_WHOLE_PROGRAM or remaining() <= 0.5 + 1.5 * build_seconds(problem):
        why = (f"the whole program ({program_size(problem)} Booleans) is too large to close it"
               if program_size(problem) > MAX_WHOLE_PROGRAM else "the time limit ended the search")
        return finish("FEASIBLE" if best else "UNKNOWN", f"memory binds: {_gap(best, lower)} above the Lagrangian bound "
                      f"{lower}; {why}")
    result = solve(problem, memory_limit, remaining(), seed, hint=best[1] if best else None, lower_bound=lower,
                   deadline=deadline)
    if result.choice is not None and (best is None or result.objective <= best[0]):
        best = (result.objective, result.choice)
    lower = max(lower, result.bound or lower) if result.status != "OPTIMAL" else (best[0] if best else lower)
    if result.status == "OPTIMAL":
        return finish("OPTIMAL", "memory binds: CP-SAT on the whole program proved the optimum")
    return finish("FEASIBLE" if best else result.status,
                  f"memory binds: {_gap(best, lower)} above the proven bound {lower}; CP-SAT on the whole program "
                  f"stopped at the time limit ({result.status})")


def _finish(status: str, best, lower: int, start: float, notes: tuple[str, ...]) -> tuple[SolveResult, tuple[str, ...]]:
    return SolveResult(status, best[0] if best else None, lower, best[1] if best else None,
                       time.perf_counter() - start, 0), notes


def _bisect_price(at: Callable[[float], bool], costs, mems, done: Callable[[], bool]) -> None:
    """Find a feasible price by doubling, then bisect between infeasible and feasible prices."""
    scale = max(1.0, sum(float(c.max()) for c in costs)) / max(1.0, sum(float(m.max()) for m in mems))
    low, high = 0.0, scale
    for _ in range(80):
        if done() or at(high):
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


def _gap(best: tuple[int, tuple[int, ...]] | None, lower: int) -> str:
    return f"{100.0 * (best[0] - lower) / max(1, lower):.2f}%" if best else "n/a"


def _ceil_bound(bound: float) -> int:
    # Float sums of up to ~1e4 integer-valued terms: allow a relative rounding slack.
    return int(math.ceil(bound - 1e-9 * abs(bound) - 1e-6))


def _certified(objective: int, bound: float) -> bool:
    return objective <= _ceil_bound(bound)
