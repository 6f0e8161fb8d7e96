"""The search methods of a flat plan, as one registry: ``METHODS`` maps a name to a ``Method``.

A method takes a built problem, the memory limit and the search budget (``Call``) and returns a
costed ``Plan``. ``chooses_auto``: the method itself decides a per-layer ``auto`` recompute or ZeRO
setting (the exact decomposition per layer, the Megatron grid over uniform modes); the others are
refused such a setting by ``api.plan_problem``. Adding a method is one function and one
``register`` call (``tests/test_registries.py`` adds a toy one)::

    register(Method("mine", solve_mine, "what it does"))
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from planner.cost.problem import Problem, rebuilt
from planner.errors import SettingsError
from planner.grid import megatron_grid
from planner.plans import Plan, failed, make_plan, strategies_from_choice
from planner.search.baselines import data_parallel, drec_cost, greedy, megatron
from planner.search.exact import solve_exact
from planner.search.fallback import program_size
from planner.search.reduce import Progress
from planner.search.sapp import sapp
from planner.search.solver import solve
from planner.search.whole import MAX_WHOLE_PROGRAM


@dataclass(frozen=True, slots=True)
class Call:
    """One search's budget: wall-clock limit, solver seed, workers, progress callback, and when
    it began (the plan's ``search_time_s`` counts from it)."""

    time_limit_s: float
    seed: int
    jobs: int
    progress: Progress | None
    start: float


@dataclass(frozen=True, slots=True)
class Method:
    """A search method: ``solve(problem, memory_limit, call) -> Plan``."""

    name: str
    solve: Callable[[Problem, float, Call], Plan]
    summary: str
    chooses_auto: bool = False


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to the registry (a name registered twice is refused)."""
    if method.name in METHODS:
        raise SettingsError(f"method: {method.name!r} is registered already")
    METHODS[method.name] = method
    return method


def method(name: str) -> Method:
    """The registered method ``name``; SettingsError naming the known ones."""
    if name not in METHODS:
        raise SettingsError(f"--method: unknown method {name!r} (known: {', '.join(METHODS)})")
    return METHODS[name]


def _exact(problem: Problem, memory_limit: float, call: Call) -> Plan:
    result, notes = solve_exact(
        problem, memory_limit, call.time_limit_s, call.seed, call.jobs, call.progress
    )
    return _from_result(problem, "exact", memory_limit, call, result, notes)


def _whole(problem: Problem, memory_limit: float, call: Call) -> Plan:
    size = program_size(problem)
    if size > MAX_WHOLE_PROGRAM:
        return failed(
            problem,
            method="whole",
            status="UNKNOWN",
            search_time_s=time.perf_counter() - call.start,
            memory_limit=memory_limit,
            notes=("whole-graph integer program not attempted",),
            explanation=f"whole-graph program too large to build ({size} Booleans > "
            f"{MAX_WHOLE_PROGRAM})",
        )
    result = solve(problem, memory_limit, call.time_limit_s, call.seed)
    return _from_result(
        problem, "whole", memory_limit, call, result, ("whole-graph integer program",)
    )


def _from_result(problem, name: str, memory_limit: float, call: Call, result, notes) -> Plan:
    """An exact search's result as a plan (a failed one with its status and reason)."""
    elapsed = time.perf_counter() - call.start
    if result.choice is None:
        return failed(
            problem,
            method=name,
            status=result.status,
            search_time_s=elapsed,
            memory_limit=memory_limit,
            explanation=result.explanation,
            notes=notes,
        )
    if result.layer_recompute or result.layer_zero:
        problem = _per_layer_problem(problem, result, memory_limit)
    return make_plan(
        problem,
        strategies_from_choice(problem, result.choice),
        method=name,
        status=result.status,
        memory_limit=memory_limit,
        search_time_s=time.perf_counter() - call.start,
        notes=notes,
        explanation=result.explanation,
        bound=result.bound,
    )


def _per_layer_problem(problem: Problem, result, memory_limit: float) -> Problem:
    """The problem under the recompute / ZeRO mode chosen per layer, so the plan is costed as it
    was found; the search's objective and memory must hold under it."""
    settings = replace(
        problem.settings, layer_recompute=result.layer_recompute, layer_zero=result.layer_zero
    )
    problem = rebuilt(problem, settings)
    if problem.objective(result.choice) != result.objective or (
        problem.memory(result.choice) > memory_limit
    ):
        raise RuntimeError(
            "per-layer choice: the plan under its per-layer settings costs "
            f"{problem.objective(result.choice)}, the search found {result.objective}"
        )
    return problem


def _grid(problem: Problem, memory_limit: float, call: Call) -> Plan:
    found = megatron_grid(problem, memory_limit)
    return replace(found, search_time_s=time.perf_counter() - call.start)


def heuristic(name: str, strategies: Callable, zero: int | None = None) -> Method:
    """A method that assigns strategies without a search (HEURISTIC plans); ``zero``: the ZeRO
    stage it runs under."""

    def run(problem: Problem, memory_limit: float, call: Call) -> Plan:
        if zero is not None:
            problem = rebuilt(problem, replace(problem.settings, zero=zero))
        return make_plan(
            problem,
            strategies(problem),
            method=name,
            status="HEURISTIC",
            memory_limit=memory_limit,
            search_time_s=time.perf_counter() - call.start,
        )

    return Method(name, run, (strategies.__doc__ or name).strip().splitlines()[0])


register(Method("exact", _exact, "the homomorphism decomposition, exact", chooses_auto=True))
register(Method("whole", _whole, "one whole-graph integer program, exact"))
register(heuristic("sapp", sapp))
register(heuristic("drec-cost", drec_cost))
register(heuristic("dp", data_parallel))
register(heuristic("zero", data_parallel, zero=3))
register(heuristic("megatron", megatron))
register(heuristic("greedy", greedy))
register(
    Method(
        "megatron-grid",
        _grid,
        "Megatron-LM configurations over the tensor axis and uniform modes",
        chooses_auto=True,
    )
)
