"""Several answers: the time-memory front (below) and the k best plans (``top_plans``).

The time-memory front: every plan that no other plan beats in both step time and memory per
device (``planner pareto``), found by the exact search under a tightening memory limit:

    L_0 = the device's memory (or --memory)
    p_k = the exact optimum under L_k            (OPTIMAL: the least time with memory <= L_k)
    L_{k+1} = memory(p_k) - 1 byte               until no plan fits (INFEASIBLE)

Each p_k is the fastest plan within L_k, so the p_k have non-increasing memory and non-decreasing
time; p_k is on the front unless p_{k+1} has the same time (then p_{k+1} uses less memory for it),
and every front point appears (a front point of memory m is the optimum under any limit in
[m, the next front point's memory)). Objectives are the integer objective and memory is in whole
bytes, as in the search, so the front is exact in those units; ``max_points`` caps the searches
(the front is then marked as cut). A search that ends FEASIBLE stops the walk: its point is kept
with its status and the front is cut there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner import api
from planner.cluster.profiles import DEFAULT_HARDWARE_CSV, MachineProfile
from planner.cost.problem import Problem, rebuilt
from planner.cost.settings import AUTO, TrainingSettings
from planner.errors import SettingsError
from planner.ir.graph import Graph
from planner.plans import Plan, make_plan, strategies_from_choice
from planner.search.fallback import program_size
from planner.search.result import SolveResult
from planner.search.topk import top_k
from planner.search.whole import MAX_WHOLE_PROGRAM
from planner.search.options import SEARCH_DEFAULTS

MAX_POINTS = 20
# plans one top-k run ranks: each is a whole-graph solve of up to --time-limit, and a small model
# has more distinct assignments than any run can list (10^8 asked for ran without end)
MAX_TOP_K = 100


@dataclass(frozen=True, slots=True)
class Front:
    """The front's plans (fastest first), the searches it took, and whether it is complete."""

    plans: tuple[Plan, ...]
    searches: int
    complete: bool
    why: str  # what ended the walk

    def rows(self) -> list[dict]:
        """One row per front point (the plan's summary row and its rank)."""
        return [{"point": k, **p.summary_row()} for k, p in enumerate(self.plans)]


def pareto_front(
    model: str | Graph,
    mesh: str = "8",
    device: str | MachineProfile = "a100-80g",
    *,
    batch: int | None = None,
    seq: int | None = None,
    memory: float | None = None,
    settings: TrainingSettings | None = None,
    max_points: int = MAX_POINTS,
    time_limit_s: float = SEARCH_DEFAULTS.time_limit_s,
    seed: int = SEARCH_DEFAULTS.seed,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
) -> Front:
    """The exact time-memory front of a model on a cluster (see the module text)."""
    if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1:
        raise SettingsError(f"max_points: must be a positive integer, got {max_points!r}")
    cluster = api.make_cluster(mesh, device, memory, hardware_csv=hardware_csv)
    problem = api.make_problem(model, cluster, settings, batch, seq)
    limit, found, searches = cluster.memory_limit, [], 0
    why = "no plan fits under the next limit"
    while True:
        if searches == max_points:
            why = f"cut after {max_points} searches (--max-points)"
            break
        plan = api.plan_problem(problem, limit, "exact", time_limit_s, seed=seed)
        searches += 1
        if plan.status == "INFEASIBLE":
            break
        found.append(plan)
        if plan.status != "OPTIMAL":
            why = f"a search ended {plan.status}: {plan.explanation or 'the time limit'}"
            break
        limit = _search_memory(problem, plan) - 1
    front = [p for p, after in zip(found, found[1:] + [None]) if not _same_time(p, after)]
    return Front(tuple(front), searches, why.startswith("no plan"), why)


def _search_memory(problem: Problem, plan: Plan) -> int:
    """The plan's memory as the search counts it (whole bytes per operator, summed), under the
    per-layer settings it was found with."""
    if AUTO in (problem.settings.recompute, problem.settings.zero):
        settings = TrainingSettings.from_dict(dict(plan.settings))
        problem = rebuilt(problem, settings)
    strategies = [tuple(dim for _, dim in op.strategy) for op in plan.operators]
    return sum(int(t.memory[t.strategies.index(s)]) for t, s in zip(problem.ops, strategies))


def _same_time(plan: Plan, after: Plan | None) -> bool:
    """Whether the next point has this one's time (then it dominates: less memory)."""
    return after is not None and after.objective == plan.objective


def _exact_first(problem, cluster, time_limit_s: float, seed: int) -> SolveResult | None:
    """The best plan by the exact search (segment decomposition, usually far faster than the
    whole-graph program), as rank 1 of the top k when it is proven OPTIMAL."""
    plan = api.plan_problem(problem, cluster.memory_limit, "exact", time_limit_s, seed=seed)
    if plan.status != "OPTIMAL":
        return None
    choice = tuple(
        table.strategies.index(tuple(dim for _, dim in op.strategy))
        for table, op in zip(problem.ops, plan.operators)
    )
    return SolveResult("OPTIMAL", plan.objective, plan.objective, choice, plan.search_time_s, 0)


def top_plans(
    model: str | Graph,
    mesh: str = "8",
    device: str | MachineProfile = "a100-80g",
    k: int = 5,
    *,
    batch: int | None = None,
    seq: int | None = None,
    memory: float | None = None,
    settings: TrainingSettings | None = None,
    time_limit_s: float = SEARCH_DEFAULTS.time_limit_s,
    seed: int = SEARCH_DEFAULTS.seed,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
) -> tuple[Plan, ...]:
    """The ``k`` best distinct plans in increasing cost (``planner.search.topk``: the whole-graph
    program with a no-good cut per plan; ``time_limit_s`` per plan)."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_TOP_K:
        raise SettingsError(f"k: must be an integer in 1..{MAX_TOP_K}, got {k!r}")
    cluster = api.make_cluster(mesh, device, memory, hardware_csv=hardware_csv)
    problem = api.make_problem(model, cluster, settings, batch, seq)
    if AUTO in (problem.settings.recompute, problem.settings.zero):
        raise SettingsError(
            "--top-k: the whole-graph program costs one recompute mode and ZeRO stage; give "
            "fixed --recompute and --zero"
        )
    size = program_size(problem)
    if size > MAX_WHOLE_PROGRAM:
        raise SettingsError(
            f"--top-k: the whole-graph program would have {size:,} Booleans (more than "
            f"{MAX_WHOLE_PROGRAM:,}); use a smaller model or mesh"
        )
    found = top_k(
        problem,
        cluster.memory_limit,
        k,
        time_limit_s,
        seed,
        _exact_first(problem, cluster, time_limit_s, seed),
    )
    return tuple(_ranked(problem, cluster, r, n, k) for n, r in enumerate(found))


def _ranked(problem, cluster, result: SolveResult, n: int, k: int) -> Plan:
    """The plan of rank ``n + 1`` of the top ``k``."""
    return make_plan(
        problem,
        strategies_from_choice(problem, result.choice),
        method="whole",
        status=result.status,
        memory_limit=cluster.memory_limit,
        search_time_s=result.search_time_s,
        notes=(f"rank {n + 1} of the {k} best plans (whole-graph program, no-good cuts)",),
        bound=result.bound,
    )
