"""The exact planner: an integer program over operator strategies and redistribution edges.

Formulation (one program per graph or per segment)::

    variables   x[o,s] in {0,1}        o operator, s a valid (non-dominated) strategy of o
                y[e,a,b] in {0,1}      e = (u -> v) an edge, a a layout u can produce for the
                                       tensor, b a layout v can ask for (incl. R* for gradients)
    X_u(a) = sum { x[u,s] : out_layout(u,s) = a }      X_v(b) = sum { x[v,s] : in_layout(v,s) = b }

    exactly_one   sum_s x[o,s] = 1                                  for every o      _add_exactly_one
    marginals     sum_b y[e,a,b] = X_u(a),  sum_a y[e,a,b] = X_v(b)  for every e, a, b _add_marginals
    memory        sum_{o,s} mem[o,s] * x[o,s] <= M                  (bytes per device)  _add_memory
    bound         objective >= L                    (a proven lower bound, optional)   build_model
    minimise      sum_{o,s} c[o,s] x[o,s] + sum_{e,a,b} c[e,a,b] y[e,a,b]

Every constraint carries its family's name (``exactly_one[o]``, ``marginal_src[e,a]``,
``marginal_dst[e,b]``, ``memory``, ``bound``) so that an invalid model names what failed.

The marginal (local-polytope) form is exact in LP on trees and tight on near-trees; the weak
form y >= x_u + x_v - 1 is never used. An edge whose producer (or consumer) has a single layout
needs no y at all: its cost is linear in X_v (or X_u). Costs are integers in the problem's unit
(``Problem.unit_s``, 1 ns by default). Memory is separable per operator, so the program is
infeasible exactly when sum_o min_s mem[o,s] > M, which ``explain_infeasible`` reports.
CP-SAT runs with a fixed seed, a time limit and a greedy solution hint.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from ortools.sat.python import cp_model

from planner.signals import run_interruptible
from planner.units import bytes_text
from planner.cost.problem import Problem

STATUS_NAMES = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE", cp_model.INFEASIBLE: "INFEASIBLE",
                cp_model.UNKNOWN: "UNKNOWN", cp_model.MODEL_INVALID: "MODEL_INVALID"}


@dataclass(frozen=True, slots=True, eq=False)
class BuiltModel:
    """A CP-SAT model with typed variable maps: ``x[op][strategy]`` and ``y[edge][(a, b)]``.

    Only candidate strategies (all, or the ``allowed`` ones) and the layouts they reach get variables.
    """

    model: cp_model.CpModel
    x: tuple[Mapping[int, cp_model.IntVar], ...]
    y: tuple[Mapping[tuple[int, int], cp_model.IntVar], ...]
    num_booleans: int


@dataclass(frozen=True, slots=True)
class SolveResult:
    status: str
    objective: int | None
    bound: int | None
    choice: tuple[int, ...] | None
    search_time_s: float
    num_booleans: int
    explanation: str = ""
    layer_recompute: tuple[tuple[int, str], ...] = ()  # under recompute 'auto': the mode chosen per layer
    layer_zero: tuple[tuple[int, int], ...] = ()  # under zero 'auto': the ZeRO stage chosen per layer


class BuildTimeout(Exception):
    """Building the program passed the search's deadline (building is Python: CP-SAT's limit cannot stop it)."""


def build_model(problem: Problem, memory_limit: float | None = None,
                allowed: Mapping[int, Sequence[int]] | None = None, lower_bound: int | None = None,
                deadline: float = math.inf) -> BuiltModel:
    """Build the program. ``allowed`` restricts some operators to a subset of their strategies.

    Raises ``BuildTimeout`` once ``time.perf_counter()`` passes ``deadline`` (checked per edge)."""
    model = cp_model.CpModel()
    x = _add_exactly_one(model, problem, allowed or {})
    objective: dict[int, int] = {}  # variable index -> cost coefficient
    for i, row in enumerate(x):
        cost = problem.ops[i].cost.tolist()
        for s, var in row.items():
            if cost[s]:
                objective[var.index] = int(cost[s])
    y = _add_marginals(model, problem, x, objective, deadline)
    if memory_limit is not None:
        _add_memory(model, problem, x, memory_limit)
    if lower_bound is not None:
        bound_expr = cp_model.LinearExpr.weighted_sum([model.get_bool_var_from_proto_index(v) for v in objective],
                                                      list(objective.values()))
        model.add(bound_expr >= int(lower_bound)).with_name("bound")
    # Written into the proto directly: CpModel.minimize re-flattens a 10^5-term expression (0.8 s measured
    # on gpt2-medium 2x4) where the coefficients are already merged per variable.
    model.proto.objective.vars.extend(list(objective))
    model.proto.objective.coeffs.extend(list(objective.values()))
    model.proto.objective.scaling_factor = 1.0
    count = sum(len(r) for r in x) + sum(len(m) for m in y)
    return BuiltModel(model, x, tuple(y), count)


def _add_exactly_one(model: cp_model.CpModel, problem: Problem,
                     allowed: Mapping[int, Sequence[int]]) -> tuple[dict[int, cp_model.IntVar], ...]:
    x = []
    for i, table in enumerate(problem.ops):
        candidates = sorted(set(allowed[i])) if i in allowed else range(len(table.strategies))
        row = {s: model.new_bool_var(f"x[{i},{s}]") for s in candidates}
        model.add_exactly_one(row.values()).with_name(f"exactly_one[{i}]")
        x.append(row)
    return tuple(x)


def _layout_sums(row: Mapping[int, cp_model.IntVar], index: np.ndarray) -> dict[int, list[cp_model.IntVar]]:
    groups: dict[int, list[cp_model.IntVar]] = {}
    for s, var in row.items():
        groups.setdefault(int(index[s]), []).append(var)
    return groups


def _add_marginals(model: cp_model.CpModel, problem: Problem, x, objective: dict[int, int],
                   deadline: float) -> list[dict]:
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
                        for var in (gb if len(src_groups) == 1 else ga):
                            objective[var.index] = objective.get(var.index, 0) + int(cost[a][b])
        else:
            for a in src_groups:
                for b in dst_groups:
                    var = y[(a, b)] = model.new_bool_var(f"y[{e_idx},{a},{b}]")
                    if cost[a][b]:
                        objective[var.index] = int(cost[a][b])
            for a, ga in src_groups.items():
                model.add(cp_model.LinearExpr.sum([y[(a, b)] for b in dst_groups]) == cp_model.LinearExpr.sum(ga)
                          ).with_name(f"marginal_src[{e_idx},{a}]")
            for b, gb in dst_groups.items():
                model.add(cp_model.LinearExpr.sum([y[(a, b)] for a in src_groups]) == cp_model.LinearExpr.sum(gb)
                          ).with_name(f"marginal_dst[{e_idx},{b}]")
        y_maps.append(y)
    return y_maps


def _add_memory(model: cp_model.CpModel, problem: Problem, x, memory_limit: float) -> None:
    terms = [int(problem.ops[i].memory[s]) * var for i, row in enumerate(x) for s, var in row.items()
             if problem.ops[i].memory[s]]
    model.add(sum(terms) <= int(memory_limit)).with_name("memory")


def greedy_choice(problem: Problem, memory_limit: float | None = None) -> tuple[int, ...]:
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
    if memory_limit is not None and problem.memory(choice) > memory_limit:
        choice = [int(np.argmin(t.memory)) for t in problem.ops]
    return tuple(choice)


BUILD_SECONDS_PER_BOOLEAN = 1e-5  # measured: 279k Booleans (gpt2-medium, 2x4) built in 2.2 s on 2 cores
LOAD_SECONDS_PER_BOOLEAN = 3e-6  # measured: CP-SAT took 0.55-0.77 s to stop at a 0.01 s limit on those 279k


def program_size(problem: Problem, allowed: Mapping[int, Sequence[int]] | None = None) -> int:
    """Booleans of the program: strategies, plus layout pairs of edges with several layouts at both ends."""
    def layouts(op: int, index: np.ndarray, distinct: int) -> int:
        return len(set(index[list(allowed[op])].tolist())) if allowed and op in allowed else distinct
    pairs = 0
    for e in problem.all_edges:
        a, b = layouts(e.src, e.src_index, len(e.src_layouts)), layouts(e.dst, e.dst_index, len(e.dst_layouts))
        pairs += a * b if a > 1 and b > 1 else 0
    return pairs + sum(len(allowed[i]) if allowed and i in allowed else len(t.strategies)
                       for i, t in enumerate(problem.ops))


def build_seconds(problem: Problem, allowed: Mapping[int, Sequence[int]] | None = None) -> float:
    """Estimated time to build the CP-SAT model (it is Python, so it is not interruptible by CP-SAT's limit)."""
    return BUILD_SECONDS_PER_BOOLEAN * program_size(problem, allowed)


def separable_bound(problem: Problem) -> int:
    """A proven lower bound on the objective: every operator and every edge at its own minimum."""
    return int(sum(int(t.cost.min()) for t in problem.ops) + sum(int(e.cost.min()) for e in problem.all_edges))


def _too_short(problem: Problem, memory_limit: float | None, hint, lower_bound, start: float) -> SolveResult:
    """The time limit cannot even cover building the model: the greedy plan, with the separable bound."""
    choice = tuple(hint) if hint is not None else greedy_choice(problem, memory_limit)
    why = f"time limit shorter than building the CP-SAT model (about {build_seconds(problem):.0f} s): greedy plan"
    return _hint_result(problem, memory_limit, choice, max(separable_bound(problem), lower_bound or 0), start, 0, why)


def greedy_result(problem: Problem, memory_limit: float | None, start: float) -> SolveResult:
    """The greedy plan as a FEASIBLE result with the separable bound (UNKNOWN if it does not fit)."""
    return _hint_result(problem, memory_limit, greedy_choice(problem, memory_limit), separable_bound(problem),
                        start, 0, "greedy plan")


def _hint_result(problem: Problem, memory_limit: float | None, hint: Sequence[int], bound: int, start: float,
                 num_booleans: int, why: str) -> SolveResult:
    """The solution hint as the result of a search the time limit stopped (UNKNOWN if it does not fit)."""
    if memory_limit is not None and problem.memory(hint) > memory_limit:
        return SolveResult("UNKNOWN", None, None, None, time.perf_counter() - start, num_booleans,
                           f"{why}, and the greedy hint does not fit the memory limit")
    return SolveResult("FEASIBLE", problem.objective(hint), bound, tuple(hint), time.perf_counter() - start,
                       num_booleans, why)


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
    return (f"memory: the plan needs at least {bytes_text(need)} per device but the limit is "
            f"{bytes_text(memory_limit)}; try {', '.join(levers[:-1])} or {levers[-1]}")


def solve(problem: Problem, memory_limit: float | None = None, time_limit_s: float = 60.0, seed: int = 0,
          workers: int = 1, allowed: Mapping[int, Sequence[int]] | None = None,
          hint: Sequence[int] | None = None, lower_bound: int | None = None,
          deadline: float | None = None) -> SolveResult:
    """Solve the program with CP-SAT. Deterministic for a fixed seed and worker count.

    ``hint`` replaces the greedy solution hint; ``lower_bound`` (a proven bound on the optimum,
    e.g. a Lagrangian one) is added as a cut on the objective. ``time_limit_s`` counts from the
    call (building the model included); ``deadline`` (a ``time.perf_counter`` value) caps it too.
    """
    start = time.perf_counter()
    deadline = min(deadline if deadline is not None else math.inf, start + time_limit_s)
    if memory_limit is not None and min_memory(problem) > memory_limit:
        return SolveResult("INFEASIBLE", None, None, None, time.perf_counter() - start, 0,
                           explain_infeasible(problem, memory_limit))
    if build_seconds(problem, allowed) > deadline - start and not allowed:
        return _too_short(problem, memory_limit, hint, lower_bound, start)
    try:
        built = build_model(problem, memory_limit, allowed, lower_bound, math.inf if allowed else deadline)
    except BuildTimeout:
        return _too_short(problem, memory_limit, hint, lower_bound, start)
    start_hint = hint or (None if allowed else greedy_choice(problem, memory_limit))
    if start_hint is not None and LOAD_SECONDS_PER_BOOLEAN * built.num_booleans > deadline - time.perf_counter():
        # CP-SAT's loading and first presolve ignore its time limit: starting it now would overrun.
        return _hint_result(problem, memory_limit, start_hint, max(separable_bound(problem), lower_bound or 0),
                            start, built.num_booleans, "time limit reached before CP-SAT could load the model")
    if start_hint is not None:
        for row, s in zip(built.x, start_hint):
            for k, var in row.items():
                built.model.add_hint(var, k == s)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, deadline - time.perf_counter())
    solver.parameters.random_seed = int(seed)
    solver.parameters.num_workers = int(workers)
    # Measured on gpt2-small (mesh 8): one worker with full LP linearisation proves optimality in
    # about 1 s; two workers without it were still FEASIBLE (6% gap) after 120 s.
    solver.parameters.linearization_level = 2
    solver.parameters.catch_sigint_signal = False  # Ctrl-C must interrupt, not end the search as a result
    code = run_interruptible(lambda: solver.solve(built.model), solver.stop_search)
    status = STATUS_NAMES.get(code, "UNKNOWN")
    elapsed = time.perf_counter() - start
    bound = max(separable_bound(problem), lower_bound or 0)
    if code == cp_model.UNKNOWN and start_hint is not None:
        # Time-out before CP-SAT reported a solution: the best plan known is the hint itself.
        return _hint_result(problem, memory_limit, start_hint, bound, start, built.num_booleans,
                            "time limit reached before CP-SAT improved on its hint")
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        why = explain_infeasible(problem, memory_limit) if code == cp_model.INFEASIBLE and memory_limit else ""
        return SolveResult(status, None, None, None, elapsed, built.num_booleans, why)
    choice = tuple(next(k for k, var in row.items() if solver.boolean_value(var)) for row in built.x)
    return SolveResult(status, int(round(solver.objective_value)),
                       max(bound, int(math.ceil(solver.best_objective_bound - 1e-6))), choice, elapsed, built.num_booleans)
