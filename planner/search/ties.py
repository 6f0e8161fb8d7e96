"""Exact search with tied parameters: cutset conditioning on the owner's layout.

A tie edge (``planner.cost.terms.tied_reads``) joins the first reader of a parameter (the owner,
which stores it) to a later reader, across the whole model: it would remove every single-tensor
cut. Instead, the search conditions on the owner's layout of the tied parameter:

    OPT = min over owner layouts L of  OPT(problem | owner restricted to strategies with layout L,
                                              each reader's cost += tie_cost[L, reader's layout])

Each conditioned problem has no tie edge, so it decomposes as before; its segments that neither
the owner nor a reader touches are reduced once for all conditions (their content keys repeat).
The conditions are the distinct layouts of the parameter among the owner's strategies (at most
a few per mesh axis); past ``MAX_CONDITIONS`` the whole-graph program (which holds the tie edges
as ordinary pairwise terms) solves the problem instead.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace
from typing import Callable


import numpy as np

from planner.cost.problem import Problem
from planner.search.decompose import group_blocks, product_block, split_segments
from planner.search.reduce import reduce_segment
from planner.search.restrict import reindex_edge, restrict_op
from planner.search.fallback import separable_bound
from planner.search.result import SolveResult
from planner.search.solver import solve

MAX_CONDITIONS = 64
RELAX_SHARE = 0.2  # of the time limit: the conditions' relaxations, which order and prune them


def owner_groups(problem: Problem) -> dict[int, dict[tuple, list[int]]]:
    """Per owner op: its strategies grouped by the layouts they give its tied parameters."""
    groups: dict[int, dict[tuple, list[int]]] = {}
    for owner in sorted({t.src for t in problem.ties}):
        ties = [t for t in problem.ties if t.src == owner]
        rows = groups.setdefault(owner, {})
        for s in range(len(problem.ops[owner].strategies)):
            rows.setdefault(tuple(t.src_layouts[t.src_index[s]] for t in ties), []).append(s)
    return groups


def conditioned(problem: Problem, chosen: dict[int, tuple]) -> Problem:
    """The problem with each owner restricted to the strategies that give its tied parameters the
    ``chosen`` layouts, and each tie edge folded into its reader's unary cost. Layouts are matched
    by value, so the same condition applies to a variant of the problem (recompute / ZeRO per
    layer)."""
    groups = owner_groups(problem)
    kept = {owner: groups[owner].get(layouts, []) for owner, layouts in chosen.items()}
    ops = list(problem.ops)
    for owner, strategies in kept.items():
        ops[owner] = restrict_op(ops[owner], strategies)
    for tie in problem.ties:
        ties = [t for t in problem.ties if t.src == tie.src]
        row = tie.src_layouts.index(chosen[tie.src][ties.index(tie)])
        reader = ops[tie.dst]
        ops[tie.dst] = replace(reader, cost=reader.cost + tie.cost[row][tie.dst_index])
    edges = tuple(reindex_edge(e, kept) for e in problem.edges)
    return replace(
        problem,
        ops=tuple(ops),
        edges=edges,
        ties=(),
        _producer_index={},
        conditions=tuple(sorted(chosen.items())),
    )


def free_optima(
    problem: Problem, chosen: list[dict], reduced: dict, deadline: float
) -> list[float]:
    """The optimum of each condition (``{owner: layouts}``) without a memory limit, from the tied
    problem's own segments: a condition is the tied problem with the owner's other strategies at
    cost inf and the tie costs added to the readers' unary costs, so only the segments holding an
    owner or a reader are reduced again; the others share one reduction (``reduced``, by content
    key, as the conditioned problems' searches do). Costs are integers, so each value equals the
    conditioned problem's optimum exactly (test); -inf for a condition reached past ``deadline``."""
    segments = split_segments(problem)
    if len(segments) <= 1:
        return [-math.inf] * len(chosen)
    base = [t.cost.astype(np.float64) for t in problem.ops]
    touched = {t.src for t in problem.ties} | {t.dst for t in problem.ties}
    changed = {k for k, seg in enumerate(segments) if touched.intersection(seg.ops)}
    # a changed segment is its own unit: never merged into a run of equal layers
    keyed = [
        replace(seg, key=f"{seg.key}|{k}") if k in changed else seg
        for k, seg in enumerate(segments)
    ]
    groups, values = owner_groups(problem), []
    for condition in chosen:
        if time.perf_counter() >= deadline:
            values.append(-math.inf)
            continue
        unary = _condition_costs(problem, base, groups, condition)
        try:
            tables = [
                reduce_segment(
                    problem,
                    seg,
                    unary if k in changed else base,
                    deadline,
                    None if k in changed else reduced,
                ).table
                for k, seg in enumerate(segments)
            ]
        except TimeoutError:
            values.append(-math.inf)
            continue
        values.append(float(product_block(group_blocks(keyed, tables)).table[0, 0]))
    return values


def _condition_costs(problem: Problem, base: list, groups: dict, chosen: dict) -> list:
    """The unary costs of a condition: an owner's strategies outside its layouts at inf, each
    reader's cost plus its tie's cost at the owner's layout (``conditioned``'s, as costs)."""
    unary = list(base)
    for owner, layouts in chosen.items():
        gate = np.full(len(base[owner]), math.inf)
        gate[groups[owner][layouts]] = 0.0
        unary[owner] = base[owner] + gate
    for tie in problem.ties:
        ties = [t for t in problem.ties if t.src == tie.src]
        row = tie.src_layouts.index(chosen[tie.src][ties.index(tie)])
        unary[tie.dst] = unary[tie.dst] + tie.cost[row][tie.dst_index]
    return unary


def solve_tied(
    problem: Problem,
    memory_limit: float,
    time_limit_s: float,
    seed: int,
    solve_untied: Callable[[Problem, float, int | None], tuple[SolveResult, tuple[str, ...]]],
    relax: Callable[[list[dict], float], list[float]] | None = None,
    whole: Callable | None = None,
) -> tuple[SolveResult, tuple[str, ...]]:
    """The exact optimum over every owner layout (see the module docstring). ``solve_untied(p,
    time_limit_s, incumbent)`` solves one conditioned problem (status DOMINATED when it proves that
    nothing there beats the incumbent cost); ``relax(conditions, deadline)``, a lower bound on each
    condition (``{owner: layouts}``; the unconstrained optimum, when memory can only add time; -inf
    past the deadline: a fifth of the time limit for all of them), orders the conditions and prunes
    those that cannot beat the best plan found. Two passes: each condition first gets a short share
    of the time, then the ones left unproven get the rest, with the best plan of all as
    incumbent. OPTIMAL when every condition was solved to optimality, proven infeasible or proven
    no better than the best.
    ``whole(p, memory_limit, time_limit_s, seed) -> (result, notes)`` solves the tied problem as one
    program when the conditions are too many (default: ``solve``)."""
    start = time.perf_counter()
    groups = owner_groups(problem)
    owners = sorted(groups)
    combos = list(itertools.product(*(sorted(groups[o].items()) for o in owners)))
    if len(combos) > MAX_CONDITIONS:
        result, said = (whole or _plain)(problem, memory_limit, time_limit_s, seed)
        return result, (
            f"{len(combos)} layouts of tied parameters: solved as one whole-graph program",
        ) + said
    search = _Conditions(problem, combos, owners, relax, start + RELAX_SHARE * time_limit_s)
    pending = sorted(range(len(combos)), key=lambda k: (search.lower[k], k))
    for sweep in (0, 1):
        pending, stuck = _sweep(search, pending, sweep, start, time_limit_s, solve_untied)
        if stuck:
            # the segments of a condition cannot be reduced in time: no other condition's can be
            # either, so the whole tied program (the ties as pairwise terms) gets the rest
            return _whole_rest(problem, memory_limit, time_limit_s, seed, start, search, whole)
    return search.result(time.perf_counter() - start, tuple(pending))


WHOLE_FALLBACK = "solved as one whole-graph program"


def _sweep(search, pending: list, sweep: int, start: float, time_limit_s: float, solve_untied):
    """One pass over the pending conditions, each with its share of the time left: (the ones left
    unsettled, whether the first one fell back to the whole program)."""
    left_over = []
    for n, k in enumerate(pending):
        left = time_limit_s - (time.perf_counter() - start)
        if left <= 0:  # out of time: the rest stay unsettled
            left_over.append(k)
            continue
        # the first condition (least bound) most likely holds the optimum, whose cost prunes the
        # rest: it gets half the time; a condition that is settled early returns its share
        share = left / 2 if sweep == 0 and n == 0 else left / (len(pending) - n)
        if not search.attempt(k, max(share, 1e-3), solve_untied):
            left_over.append(k)
        if (
            sweep == 0
            and n == 0
            and any(WHOLE_FALLBACK in note for note in search.notes.get(k, ()))
        ):
            return left_over, True
    return left_over, False


def _whole_rest(
    problem: Problem,
    memory_limit: float,
    time_limit_s: float,
    seed: int,
    start: float,
    search: "_Conditions",
    whole,
) -> tuple[SolveResult, tuple[str, ...]]:
    """The tied problem as one program in the time left, its hint the first condition's plan."""
    left = max(1e-3, time_limit_s - (time.perf_counter() - start))
    result, said = (whole or _plain)(problem, memory_limit, left, seed)
    first = search.best
    if result.choice is None or (first is not None and first.objective < result.objective):
        if first is not None:
            result = replace(
                first,
                status="FEASIBLE",
                bound=min(first.objective, result.bound or 0),
                search_time_s=time.perf_counter() - start,
            )
    note = (
        "the first tied-layout condition's segments ran out of time: the tied problem was solved "
        f"as one whole-graph program in the {left:.1f} s left",
    )
    return replace(result, search_time_s=time.perf_counter() - start), note + tuple(said)


def _plain(problem: Problem, memory_limit: float, time_limit_s: float, seed: int):
    return solve(problem, memory_limit, time_limit_s, seed), ()


class _Conditions:
    """The conditions' bookkeeping: best plan, bound, which are settled."""

    def __init__(
        self, problem: Problem, combos: list, owners: list[int], relax, deadline: float
    ) -> None:
        self.problem, self.combos, self.owners = problem, combos, owners
        self.chosen = [
            {owner: layouts for owner, (layouts, _) in zip(owners, combo)} for combo in combos
        ]
        self.lower = relax(self.chosen, deadline) if relax else [-math.inf] * len(combos)
        self.best, self.bounds, self.refused, self.pruned = None, {}, None, 0
        self.notes: dict[int, tuple[str, ...]] = {}  # per condition, what its latest attempt said
        self.best_k: int | None = None

    def attempt(self, k: int, limit: float, solve_untied) -> bool:
        """Solve condition k within ``limit`` seconds; whether it is settled (optimal, infeasible,
        dominated)."""
        best = self.best
        if best is not None and self.lower[k] >= best.objective:
            self.pruned += 1  # its relaxation cannot beat the plan in hand: nor can it
            return True
        untied = conditioned(self.problem, self.chosen[k])
        result, said = solve_untied(untied, limit, None if best is None else best.objective)
        self.notes[k] = tuple(said)
        if result.status == "DOMINATED":
            self.pruned += 1
            return True
        if result.status == "INFEASIBLE":
            self.refused = result
            return True
        if result.choice is not None:
            kept = {
                owner: strategies for owner, (_, strategies) in zip(self.owners, self.combos[k])
            }
            candidate = _lift(self.problem, result, kept)
            if best is None or candidate.objective < best.objective:
                self.best, self.best_k = candidate, k
        if result.bound is not None:
            self.bounds[k] = result.bound
        else:  # a plan under per-layer choices without a bound: only 0 is proven (costs are >= 0)
            self.bounds[k] = (
                0
                if result.layer_recompute or result.layer_zero
                else max(self.lower[k], separable_bound(untied))
            )
        return result.status == "OPTIMAL"

    def result(
        self, elapsed: float, unsettled: tuple[int, ...]
    ) -> tuple[SolveResult, tuple[str, ...]]:
        """The best plan over the conditions. Its notes say how the best condition was solved (and,
        unless every condition is settled, what stopped the unsettled ones): a condition settled
        later says nothing of the time limit an earlier attempt ran into."""
        told = (
            ((self.best_k,) + tuple(unsettled))
            if self.best_k is not None
            else tuple(sorted(self.notes))
        )
        notes: tuple[str, ...] = ()
        for k in told:
            notes += tuple(
                note
                for note in self.notes.get(k, ())
                if all(note[:40] != seen[:40] for seen in notes)
            )
        notes += (
            f"tied parameters: conditioned on {len(self.combos)} layout(s) of their owners"
            + (f", {self.pruned} proven no better than the best" if self.pruned else ""),
        )
        if self.best is None:
            if not unsettled and self.refused is not None:
                return replace(self.refused, search_time_s=elapsed), notes
            why = "no layout of the tied parameters gave a plan within the time limit"
            return SolveResult.no_plan("UNKNOWN", why, elapsed), notes
        if not unsettled:
            return replace(
                self.best, status="OPTIMAL", bound=self.best.objective, search_time_s=elapsed
            ), notes
        bound = min([self.best.objective] + list(self.bounds.values()))
        return replace(self.best, status="FEASIBLE", bound=int(bound), search_time_s=elapsed), notes


def _lift(problem: Problem, result: SolveResult, kept: dict[int, list[int]]) -> SolveResult:
    """A conditioned problem's plan as a plan of the tied problem (owner strategies re-indexed)."""
    choice = list(result.choice)
    for owner, strategies in kept.items():
        choice[owner] = strategies[choice[owner]]
    # under per-layer recompute / ZeRO the objective is the chosen variants': not re-checkable here
    objective = (
        result.objective
        if result.layer_recompute or result.layer_zero
        else problem.objective(choice)
    )
    if objective != result.objective:
        raise RuntimeError(
            f"conditioned objective {result.objective} disagrees with the tied one {objective}"
        )
    return replace(result, choice=tuple(choice), objective=objective)
