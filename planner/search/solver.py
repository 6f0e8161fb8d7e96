"""The exact planner: an integer program over operator strategies and redistribution edges.

Formulation (one program per graph or per segment)::

    variables   x[o,s] in {0,1}        o operator, s a valid (non-dominated) strategy of o
                y[e,a,b] in {0,1}      e = (u -> v) an edge, a a layout u can produce for the
                                       tensor, b a layout v can ask for (incl. R* for gradients)
    X_u(a) = sum { x[u,s] : out_layout(u,s) = a }      X_v(b) = sum { x[v,s] : in_layout(v,s) = b }

    exactly_one   sum_s x[o,s] = 1                                   for every o
    marginals     sum_b y[e,a,b] = X_u(a),  sum_a y[e,a,b] = X_v(b)  for every e, a, b
    memory        sum_{o,s} mem[o,s] * x[o,s] <= M                   (bytes per device)
    bound         objective >= L                     (a proven lower bound, optional)
    minimise      sum_{o,s} c[o,s] x[o,s] + sum_{e,a,b} c[e,a,b] y[e,a,b]

(built by _add_exactly_one, _add_marginals, _add_memory and build_model)

Every constraint carries its family's name (``exactly_one[o]``, ``marginal_src[e,a]``,
``marginal_dst[e,b]``, ``memory``, ``bound``) so that an invalid model names what failed.

The marginal (local-polytope) form is exact in LP on trees and tight on near-trees; the weak
form y >= x_u + x_v - 1 is never used. An edge whose producer (or consumer) has a single layout
needs no y at all: its cost is linear in X_v (or X_u). Costs are integers in the problem's unit
(``Problem.unit_s``, 1 ns by default). Memory is separable per operator, so the program is
infeasible exactly when sum_o min_s mem[o,s] > M, which ``fallback.explain_infeasible`` reports.
CP-SAT runs with a fixed seed, a time limit and a greedy solution hint.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from planner.search.options import SEARCH_DEFAULTS
from planner.signals import run_interruptible
from planner.cost.problem import Problem
from planner.search.fallback import (
    LOAD_SECONDS_PER_BOOLEAN,
    build_seconds,
    explain_infeasible,
    greedy_choice,
    hint_result,
    min_memory,
    separable_bound,
    too_short,
)
from planner.search.result import SolveResult

if TYPE_CHECKING:
    from ortools.sat.python import cp_model
# CP-SAT is imported where a program is built or solved: it brings pandas with it (0.2 s of every
# start-up), and a plan the decomposition or the Pareto master finds needs neither.


@dataclass(frozen=True, slots=True, eq=False)
class BuiltModel:
    """A CP-SAT model with typed variable maps: ``x[op][strategy]`` and ``y[edge][(a, b)]``.

    Only candidate strategies (all, or the ``allowed`` ones) and the layouts they reach get
    variables.
    """

    model: cp_model.CpModel
    x: tuple[Mapping[int, cp_model.IntVar], ...]
    y: tuple[Mapping[tuple[int, int], cp_model.IntVar], ...]
    num_booleans: int


class BuildTimeout(Exception):
    """Building the program passed the search's deadline (building is Python: CP-SAT's limit cannot
    stop it)."""


def build_model(
    problem: Problem,
    memory_limit: float = math.inf,
    allowed: Mapping[int, Sequence[int]] | None = None,
    lower_bound: int | None = None,
    deadline: float = math.inf,
) -> BuiltModel:
    """Build the program. ``allowed`` restricts some operators to a subset of their strategies.

    Raises ``BuildTimeout`` once ``time.perf_counter()`` passes ``deadline`` (checked per edge)."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    x = _add_exactly_one(model, problem, allowed or {})
    objective: dict[int, int] = {}  # variable index -> cost coefficient
    for i, row in enumerate(x):
        cost = problem.ops[i].cost.tolist()
        for s, var in row.items():
            if cost[s]:
                objective[var.index] = int(cost[s])
    y = _add_marginals(model, problem, x, objective, deadline)
    if math.isfinite(memory_limit):
        _add_memory(model, problem, x, memory_limit)
    if lower_bound is not None:
        bound_expr = cp_model.LinearExpr.weighted_sum(
            [model.get_bool_var_from_proto_index(v) for v in objective], list(objective.values())
        )
        model.add(bound_expr >= int(lower_bound)).with_name("bound")
    # Written into the proto directly: CpModel.minimize re-flattens a 10^5-term expression (0.8 s
    # measured on gpt2-medium 2x4) where the coefficients are already merged per variable.
    model.proto.objective.vars.extend(list(objective))
    model.proto.objective.coeffs.extend(list(objective.values()))
    model.proto.objective.scaling_factor = 1.0
    count = sum(len(r) for r in x) + sum(len(m) for m in y)
    return BuiltModel(model, x, tuple(y), count)


def _add_exactly_one(
    model: cp_model.CpModel, problem: Problem, allowed: Mapping[int, Sequence[int]]
) -> tuple[dict[int, cp_model.IntVar], ...]:
    x = []
    for i, table in enumerate(problem.ops):
        candidates = sorted(set(allowed[i])) if i in allowed else range(len(table.strategies))
        row = {s: model.new_bool_var(f"x[{i},{s}]") for s in candidates}
        model.add_exactly_one(row.values()).with_name(f"exactly_one[{i}]")
        x.append(row)
    return tuple(x)


def _layout_sums(
    row: Mapping[int, cp_model.IntVar], index: np.ndarray
) -> dict[int, list[cp_model.IntVar]]:
    groups: dict[int, list[cp_model.IntVar]] = {}
    for s, var in row.items():
        groups.setdefault(int(index[s]), []).append(var)
    return groups


def _add_marginals(
    model: cp_model.CpModel, problem: Problem, x, objective: dict[int, int], deadline: float
) -> list[dict]:
    from ortools.sat.python import cp_model

    y_maps = []
    for e_idx, edge in enumerate(problem.all_edges):
        if time.perf_counter() > deadline:
            raise BuildTimeout(f"building stopped at edge {e_idx} of {len(problem.all_edges)}")
        src_groups = _layout_sums(x[edge.src], edge.src_index)
        dst_groups = _layout_sums(x[edge.dst], edge.dst_index)
        cost = edge.cost.tolist()
        y: dict[tuple[int, int], cp_model.IntVar] = {}
        if len(src_groups) == 1 or len(dst_groups) == 1:
            # One side has a single layout: the pair is fixed by the other side's choice.
            for a, ga in src_groups.items():
                for b, gb in dst_groups.items():
                    if cost[a][b]:
                        for var in gb if len(src_groups) == 1 else ga:
                            objective[var.index] = objective.get(var.index, 0) + int(cost[a][b])
        else:
            for a in src_groups:
                for b in dst_groups:
                    var = y[(a, b)] = model.new_bool_var(f"y[{e_idx},{a},{b}]")
                    if cost[a][b]:
                        objective[var.index] = int(cost[a][b])
            for a, ga in src_groups.items():
                model.add(
                    cp_model.LinearExpr.sum([y[(a, b)] for b in dst_groups])
                    == cp_model.LinearExpr.sum(ga)
                ).with_name(f"marginal_src[{e_idx},{a}]")
            for b, gb in dst_groups.items():
                model.add(
                    cp_model.LinearExpr.sum([y[(a, b)] for a in src_groups])
                    == cp_model.LinearExpr.sum(gb)
                ).with_name(f"marginal_dst[{e_idx},{b}]")
        y_maps.append(y)
    return y_maps


def _add_memory(model: cp_model.CpModel, problem: Problem, x, memory_limit: float) -> None:
    terms = [
        int(problem.ops[i].memory[s]) * var
        for i, row in enumerate(x)
        for s, var in row.items()
        if problem.ops[i].memory[s]
    ]
    model.add(sum(terms) <= int(memory_limit)).with_name("memory")


def solve(
    problem: Problem,
    memory_limit: float = math.inf,
    time_limit_s: float = SEARCH_DEFAULTS.time_limit_s,
    seed: int = SEARCH_DEFAULTS.seed,
    workers: int = 1,
    allowed: Mapping[int, Sequence[int]] | None = None,
    hint: Sequence[int] | None = None,
    lower_bound: int | None = None,
    deadline: float | None = None,
) -> SolveResult:
    """Solve the program with CP-SAT. Deterministic for a fixed seed and worker count.

    ``hint`` replaces the greedy solution hint; ``lower_bound`` (a proven bound on the optimum,
    e.g. a Lagrangian one) is added as a cut on the objective. ``time_limit_s`` counts from the
    call (building the model included); ``deadline`` (a ``time.perf_counter`` value) caps it too.
    """
    start = time.perf_counter()
    deadline = min(deadline if deadline is not None else math.inf, start + time_limit_s)
    if min_memory(problem) > memory_limit:
        why = explain_infeasible(problem, memory_limit)
        return SolveResult.no_plan("INFEASIBLE", why, time.perf_counter() - start)
    if build_seconds(problem, allowed) > deadline - start and not allowed:
        return too_short(problem, memory_limit, hint, lower_bound, start)
    try:
        built = build_model(
            problem, memory_limit, allowed, lower_bound, math.inf if allowed else deadline
        )
    except BuildTimeout:
        return too_short(problem, memory_limit, hint, lower_bound, start)
    start_hint = hint or (None if allowed else greedy_choice(problem, memory_limit))
    bound = max(separable_bound(problem), lower_bound or 0)
    if (
        start_hint is not None
        and LOAD_SECONDS_PER_BOOLEAN * built.num_booleans > deadline - time.perf_counter()
    ):
        # CP-SAT's loading and first presolve ignore its time limit: starting it now would overrun.
        why = "time limit reached before CP-SAT could load the model"
        return hint_result(problem, memory_limit, start_hint, bound, start, built.num_booleans, why)
    for row, s in zip(built.x, start_hint or ()):
        for k, var in row.items():
            built.model.add_hint(var, k == s)
    solver = cp_solver(deadline, seed, workers)
    code = run_interruptible(lambda: solver.solve(built.model), solver.stop_search)
    if solver.status_name(code) == "UNKNOWN" and start_hint is not None:
        # Time-out before CP-SAT reported a solution: the best plan known is the hint itself.
        why = "time limit reached before CP-SAT improved on its hint"
        return hint_result(problem, memory_limit, start_hint, bound, start, built.num_booleans, why)
    return read_solution(problem, memory_limit, built, solver, code, bound, start)


def cp_solver(deadline: float, seed: int, workers: int) -> cp_model.CpSolver:
    """A CP-SAT solver with the planner's parameters, stopping at ``deadline``."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, deadline - time.perf_counter())
    solver.parameters.random_seed = int(seed)
    solver.parameters.num_workers = int(workers)
    # Measured on gpt2-small (mesh 8): one worker with full LP linearisation proves optimality in
    # about 1 s; two workers without it were still FEASIBLE (6% gap) after 120 s.
    solver.parameters.linearization_level = 2
    # Ctrl-C must interrupt, not end the search as a result
    solver.parameters.catch_sigint_signal = False
    return solver


def read_solution(
    problem: Problem,
    memory_limit: float,
    built: BuiltModel,
    solver: cp_model.CpSolver,
    code: int,
    bound: int,
    start: float,
) -> SolveResult:
    """The result CP-SAT reported: the choice and the proven bound, or the status and the
    reason."""
    from ortools.sat.python import cp_model

    status = solver.status_name(code)
    elapsed = time.perf_counter() - start
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        why = (
            explain_infeasible(problem, memory_limit)
            if code == cp_model.INFEASIBLE and math.isfinite(memory_limit)
            else ""
        )
        return SolveResult.no_plan(status, why, elapsed, built.num_booleans)
    choice = tuple(
        next(k for k, var in row.items() if solver.boolean_value(var)) for row in built.x
    )
    return SolveResult(
        status,
        int(round(solver.objective_value)),
        max(bound, int(math.ceil(solver.best_objective_bound - 1e-6))),
        choice,
        elapsed,
        built.num_booleans,
    )
