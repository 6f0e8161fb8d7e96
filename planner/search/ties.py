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
import time
from dataclasses import replace
from typing import Callable

import numpy as np

from planner.cost.problem import EdgeTable, OpTable, Problem
from planner.search.solver import SolveResult, separable_bound, solve

MAX_CONDITIONS = 64


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
    ``chosen`` layouts, and each tie edge folded into its reader's unary cost. Layouts are matched by
    value, so the same condition applies to a variant of the problem (recompute / ZeRO per layer)."""
    groups = owner_groups(problem)
    kept = {owner: groups[owner].get(layouts, []) for owner, layouts in chosen.items()}
    ops = list(problem.ops)
    for owner, strategies in kept.items():
        ops[owner] = _restrict(ops[owner], strategies)
    for tie in problem.ties:
        ties = [t for t in problem.ties if t.src == tie.src]
        row = tie.src_layouts.index(chosen[tie.src][ties.index(tie)])
        reader = ops[tie.dst]
        ops[tie.dst] = replace(reader, cost=reader.cost + tie.cost[row][tie.dst_index])
    edges = tuple(_reindex(e, kept) for e in problem.edges)
    return replace(problem, ops=tuple(ops), edges=edges, ties=(), _producer_index={},
                   conditions=tuple(sorted(chosen.items())))


def _restrict(table: OpTable, strategies: list[int]) -> OpTable:
    pick = lambda values: tuple(values[s] for s in strategies)
    return replace(table, strategies=pick(table.strategies), cost=table.cost[strategies],
                   memory=table.memory[strategies], out_layouts=pick(table.out_layouts),
                   in_layouts=pick(table.in_layouts), records=pick(table.records) if table.records else ())


def _reindex(edge: EdgeTable, kept: dict[int, list[int]]) -> EdgeTable:
    if edge.src not in kept and edge.dst not in kept:
        return edge
    src_index = edge.src_index[kept[edge.src]] if edge.src in kept else edge.src_index
    dst_index = edge.dst_index[kept[edge.dst]] if edge.dst in kept else edge.dst_index
    return replace(edge, src_index=np.ascontiguousarray(src_index), dst_index=np.ascontiguousarray(dst_index))


def solve_tied(problem: Problem, memory_limit: float | None, time_limit_s: float, seed: int,
               solve_untied: Callable[[Problem, float], tuple[SolveResult, tuple[str, ...]]]
               ) -> tuple[SolveResult, tuple[str, ...]]:
    """The exact optimum over every owner layout (see the module docstring). ``solve_untied(p,
    time_limit_s)`` solves one conditioned problem; the best plan wins, OPTIMAL when every
    condition was solved to optimality (or proven infeasible)."""
    start = time.perf_counter()
    groups = owner_groups(problem)
    owners = sorted(groups)
    combos = list(itertools.product(*(sorted(groups[o].items()) for o in owners)))
    if len(combos) > MAX_CONDITIONS:
        result = solve(problem, memory_limit, time_limit_s, seed)
        return result, (f"{len(combos)} layouts of tied parameters: solved as one whole-graph program",)
    best, bound, proven, notes, refused = None, None, True, (), None
    for n, combo in enumerate(combos):
        left = time_limit_s - (time.perf_counter() - start)
        chosen = {owner: layouts for owner, (layouts, _) in zip(owners, combo)}
        kept = {owner: strategies for owner, (_, strategies) in zip(owners, combo)}
        result, said = solve_untied(conditioned(problem, chosen), max(left / (len(combos) - n), 1e-3))
        notes += tuple(note for note in said if note not in notes)
        if result.status == "INFEASIBLE":
            refused = result
            continue
        proven = proven and result.status == "OPTIMAL"
        lower = result.bound if result.bound is not None else separable_bound(conditioned(problem, chosen))
        bound = lower if bound is None else min(bound, lower)
        if result.choice is not None:
            choice = list(result.choice)
            for owner, strategies in kept.items():
                choice[owner] = strategies[choice[owner]]
            # under per-layer recompute / ZeRO the objective is the chosen variants': not re-checkable here
            objective = result.objective if result.layer_recompute or result.layer_zero else problem.objective(choice)
            if objective != result.objective:
                raise RuntimeError(f"conditioned objective {result.objective} disagrees with the tied one {objective}")
            if best is None or objective < best.objective:
                best = replace(result, choice=tuple(choice), objective=objective)
    elapsed = time.perf_counter() - start
    notes = notes + (f"tied parameters: conditioned on {len(combos)} layout(s) of their owners",)
    if best is None:
        if proven and refused is not None:
            return replace(refused, search_time_s=elapsed), notes
        return SolveResult("UNKNOWN", None, None, None, elapsed, 0,
                           "no layout of the tied parameters gave a plan within the time limit"), notes
    status = "OPTIMAL" if proven else "FEASIBLE"
    return replace(best, status=status, bound=best.objective if proven else bound, search_time_s=elapsed), notes
