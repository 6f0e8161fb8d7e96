"""The exact planner of record: decomposition when the graph has cuts, memory kept exact.

The search runs as phases over one ``SearchState``; each returns an outcome or None (go on):

    segmented:      cut the graph into segments (``planner.search.decompose``); no cut: the
                    whole-graph program (``planner.search.whole``).
    fits nowhere:   INFEASIBLE when even every operator's least memory under any layer mode is
                    more than the limit.
    unconstrained:  reduce every distinct segment once and multiply the tables
                    (``planner.search.reduce``): the whole-graph optimum, OPTIMAL when it fits
                    (recompute only adds time; not under ZeRO 'auto', where a stage may save time).
    Pareto:         memory binds: the Pareto tables and label-setting master of
                    ``planner.search.pareto`` (exact, OPTIMAL; ``planner.search.master``); a
                    master cut after a beam pass gives FEASIBLE with its proven Lagrangian bound.
    Lagrangian:     the master could not run (fronts past their caps, its share of the time
                    limit): price bisection, restricted master, CP-SAT on the whole program
                    (``planner.search.lagrangian``).

Recompute / ZeRO 'auto': when memory binds (zero: always) the graph is costed with every layer in
each (recompute mode, ZeRO stage) pair and the Pareto master chooses a pair per layer with the
strategies (``planner.search.layer_modes``). Tied parameters: one search per layout of the owner
(``planner.search.ties``), sharing a ``SearchCache`` of the segments the ties leave alone, each
later one pruned by the best plan so far (status DOMINATED inside).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from planner.search.options import SEARCH_DEFAULTS
from planner.cost.problem import Problem
from planner.cost.settings import AUTO
from planner.search.decompose import split_segments
from planner.search.fronts import FrontTooLarge
from planner.search.lagrangian import lagrangian
from planner.search.layer_modes import layer_options, least_memory
from planner.search.master import pareto_phase
from planner.search.pareto import lagrangian_bound
from planner.search.reduce import Progress, Workers, solve_unary
from planner.search.fallback import explain_infeasible, greedy_result, min_memory
from planner.search.state import Outcome, SearchCache, SearchState
from planner.search.ties import conditioned, free_optima, solve_tied
from planner.search.whole import solve_whole, whole_instead

GREEDY_FALLBACK_OPS = 10_000  # past the time limit the greedy plan is built only where it is cheap
# (measured: 13 s on a 100k-operator chain, which would double a 10 s limit)
REDUCE_SHARE = 0.5  # of the time limit: reducing the segments; past it, the whole program's


def solve_exact(
    problem: Problem,
    memory_limit: float = math.inf,
    time_limit_s: float = SEARCH_DEFAULTS.time_limit_s,
    seed: int = SEARCH_DEFAULTS.seed,
    jobs: int = SEARCH_DEFAULTS.jobs,
    progress: Progress | None = None,
) -> Outcome:
    """The exact planner: decomposed when the graph has cuts, else the whole-graph program; tied
    parameters conditioned on (``planner.search.ties``).

    ``time_limit_s`` bounds the whole call (price steps, model building and every CP-SAT solve);
    at the limit the best plan found is returned FEASIBLE with its proven bound."""
    started = time.perf_counter()
    limit = float(memory_limit)
    result, notes = _solve_exact(SearchState(problem, limit, time_limit_s, seed, jobs, progress))
    if (
        result.choice is None
        and result.status == "UNKNOWN"
        and len(problem.ops) <= GREEDY_FALLBACK_OPS
    ):
        # as the whole-graph program does when its time is too short: the greedy plan, if it fits
        fallback = greedy_result(problem, memory_limit, started)
        if fallback.choice is not None:
            # a proven bound stands; under per-layer choices the greedy (no-choice) one does not
            auto = AUTO in (problem.settings.recompute, problem.settings.zero)
            bound = result.bound if result.bound is not None else 0 if auto else fallback.bound
            why = (
                f"the exact search found no plan in its time limit ({result.explanation}): the "
                "greedy plan"
            )
            return replace(fallback, bound=bound, explanation=why), notes + (why,)
    return result, notes


def _solve_exact(state: SearchState) -> Outcome:
    problem = state.problem
    if not problem.ties:
        return _solve_untied(state)
    cache = SearchCache()  # what a segment the ties do not touch costs is worked out once

    def untied(condition: Problem, time_limit_s: float, incumbent: int | None) -> Outcome:
        # one process: a pool per condition would start processes where an interrupt can land
        return _solve_untied(
            SearchState(
                condition,
                state.memory_limit,
                time_limit_s,
                state.seed,
                1,
                state.progress,
                cache,
                incumbent,
            )
        )

    def relaxed(conditions: list[dict], deadline: float) -> list[float]:
        if math.isinf(state.memory_limit) and problem.settings.zero != AUTO:
            # the bound is each condition's optimum: one pass over the tied problem's segments
            return free_optima(problem, conditions, cache.reduced, deadline)
        return [
            _relaxed(conditioned(problem, c), state.memory_limit, cache, deadline)
            for c in conditions
        ]

    result, notes = solve_tied(
        problem, state.memory_limit, state.time_limit_s, state.seed, untied, relaxed, solve_whole
    )
    said = (f"--jobs {state.jobs}: tied parameters are solved in this process",)
    return result, notes + (said if state.jobs > 1 else ())


def _relaxed(problem: Problem, memory_limit: float, cache: SearchCache, deadline: float) -> float:
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
            free = solve_unary(problem, segments, costs, reduced=cache.reduced, deadline=deadline)
            bound = free.value
            if problem.memory(free.choice) <= memory_limit:
                return bound  # the optimum itself (recompute 'auto' keeps it: recompute adds time)
        if math.isinf(memory_limit):
            return bound
        options = layer_options(problem, segments, cache.variants)
        return max(
            bound,
            lagrangian_bound(
                problem,
                segments,
                memory_limit,
                deadline,
                variants=options.variants,
                units=options.units,
                tables=cache.fronts,
            ),
        )
    except (TimeoutError, FrontTooLarge):
        return bound


def _solve_untied(state: SearchState) -> Outcome:
    """The phases of the module text, in order, until one returns an outcome."""
    for phase in (_segmented, _fits_nowhere):
        outcome = phase(state)
        if outcome is not None:
            return outcome
    distinct = len({s.key for s in state.segments})
    with Workers(state.problem, state.jobs, distinct) as workers:
        state.workers = workers
        if workers.size < state.jobs:
            state.notes += (
                f"--jobs {state.jobs}: {workers.size} worker(s) used (at most one per CPU and per "
                "distinct segment)",
            )
        for phase in (_unconstrained, pareto_phase):
            outcome = phase(state)
            if outcome is not None:
                return outcome
        incumbent = None if state.options.variants else state.incumbent
        return lagrangian(state, incumbent, state.proven)


def _segmented(state: SearchState) -> Outcome | None:
    """Cut into segments (none when no time is left: cutting costs 2 s per 100k operators)."""
    problem = state.problem
    state.segments = split_segments(problem) if state.time_limit_s > 0 else ()
    if state.left() <= 0:
        return state.outcome(
            "UNKNOWN",
            explanation=(
                f"the time limit ({state.time_limit_s:.1f} s left for the search) ended before any "
                "plan was found: loading and costing the model took it all; raise --time-limit"
            ),
        )
    if len(state.segments) <= 1:
        result, said = solve_whole(problem, state.memory_limit, state.time_limit_s, state.seed)
        return result, ("no single-tensor cut: solved as one whole-graph program",) + said
    distinct = len({s.key for s in state.segments})
    state.notes += (f"decomposed into {len(state.segments)} segments ({distinct} distinct)",)
    return None


def _fits_nowhere(state: SearchState) -> Outcome | None:
    """INFEASIBLE when every operator's least memory under any layer mode is over the limit."""
    problem = state.problem
    if min_memory(problem) <= state.memory_limit:
        return None
    state.options = layer_options(problem, state.segments, state.shared().variants)
    least = least_memory(problem, state.options)
    if least <= state.memory_limit:
        return None
    why = explain_infeasible(problem, state.memory_limit, least)
    return state.outcome("INFEASIBLE", explanation=why)


def _unconstrained(state: SearchState) -> Outcome | None:
    """The unconstrained optimum; OPTIMAL when it fits and only recompute is chosen per layer."""
    problem = state.problem
    costs = [t.cost.astype(np.float64) for t in problem.ops]
    began = time.perf_counter()
    reduce_by = state.start + REDUCE_SHARE * state.time_limit_s
    try:
        free = solve_unary(
            problem,
            state.segments,
            costs,
            state.workers,
            state.progress,
            reduce_by,
            state.shared().reduced,
        )
    except TimeoutError as exc:
        return whole_instead(
            problem,
            state.memory_limit,
            state.deadline,
            state.seed,
            state.start,
            state.notes,
            str(exc),
        )
    state.step_s = time.perf_counter() - began
    objective = problem.objective(free.choice)
    if objective != int(round(free.value)):
        raise RuntimeError(
            f"decomposed value {free.value} disagrees with the objective {objective}"
        )
    state.free, state.fits = free, problem.memory(free.choice) <= state.memory_limit
    if state.fits and problem.settings.zero != AUTO:
        return state.outcome("OPTIMAL", objective, objective, free.choice)
    return None
