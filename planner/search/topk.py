"""The k best plans: the whole-graph program (``planner.search.solver``) solved again with one
no-good cut per plan found.

    plan_1 = OPT(P)
    plan_j = OPT(P  and  sum_o x[o, choice_i(o)] <= |O| - 1   for every i < j)

Each cut removes exactly one assignment (the plan found), so when every solve is OPTIMAL the
objectives are the k smallest over all assignments of the problem's strategies (its
non-dominated ones, ``planner.cost.problem``), in increasing order, ties included: the plans are
distinct as assignments, not necessarily in cost. A solve that stops at its time limit ends the
list with its FEASIBLE plan (the order after it is not proven).
"""

from __future__ import annotations

import time
from typing import Sequence

from planner.cost.problem import Problem
from planner.search.fallback import greedy_choice, min_memory, separable_bound
from planner.search.result import SolveResult
from planner.search.solver import build_model, cp_solver, read_solution
from planner.signals import run_interruptible


def top_k(
    problem: Problem,
    memory_limit: float,
    k: int,
    time_limit_s: float,
    seed: int,
    first: SolveResult | None = None,
) -> list[SolveResult]:
    """Up to ``k`` best plans (fewer when fewer assignments fit); each solve gets
    ``time_limit_s``. ``first``: the best plan, already proven OPTIMAL by another search (the
    segment decomposition), taken as rank 1 so that a whole-graph solve cut by its time limit
    cannot leave the list empty; the whole-graph program then starts from its cut."""
    if min_memory(problem) > memory_limit:
        return []
    built = build_model(problem, memory_limit)
    found: list[SolveResult] = []
    if first is not None and first.status == "OPTIMAL" and first.choice is not None:
        found.append(first)
        _add_no_good(built, first.choice, 1)
    else:
        hint = greedy_choice(problem, memory_limit)
        for row, s in zip(built.x, hint or ()):
            for strategy, var in row.items():
                built.model.add_hint(var, strategy == s)
    bound = separable_bound(problem)
    while len(found) < k:
        start = time.perf_counter()
        solver = cp_solver(start + time_limit_s, seed, 1)
        code = run_interruptible(lambda: solver.solve(built.model), solver.stop_search)
        result = read_solution(problem, memory_limit, built, solver, code, bound, start)
        if result.choice is None:
            break  # INFEASIBLE: no other assignment fits (or none was found in time)
        found.append(result)
        if result.status != "OPTIMAL":
            break
        _add_no_good(built, result.choice, len(found))
    return found


def _add_no_good(built, choice: Sequence[int], n: int) -> None:
    """Forbid exactly the assignment ``choice``: at least one operator takes another strategy."""
    built.model.add(sum(row[s] for row, s in zip(built.x, choice)) <= len(choice) - 1).with_name(
        f"no_good[{n}]"
    )
    # the last plan is no longer feasible: hints would only slow the next solve
    built.model.clear_hints()
