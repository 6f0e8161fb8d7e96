"""The Lagrangian path of the exact search, when the Pareto master cannot run or was cut: memory
is additive over operators, so

    L(lam) = min_x c(x) + lam * (m(x) - M)  <=  OPT      for every lam >= 0,

each L(lam) solved exactly by the decomposition with unary costs c + lam * m
(``planner.search.reduce``). Doubling then bisection on lam keeps the best fitting plan x_f and
the best bound; if ceil(L) >= c(x_f) the plan is OPTIMAL with that certificate. Otherwise a
restricted master (the whole program over the strategies the priced solutions used), then CP-SAT
on the whole program with x_f as hint and c >= ceil(L) as a cut; its status (OPTIMAL, or FEASIBLE
at the time limit) is reported."""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from planner.search.prices import priced_bound, search_price
from planner.search.reduce import solve_unary
from planner.search.fallback import build_seconds, program_size, separable_bound
from planner.search.solver import solve
from planner.search.state import Outcome, SearchState
from planner.search.whole import MAX_WHOLE_PROGRAM

LAGRANGE_ITERATIONS = 40


class _Prices:
    """The price steps so far: the best fitting plan, the best bound, the strategies used."""

    def __init__(self, state: SearchState, incumbent: int | None, proven: int | None) -> None:
        problem = state.problem
        self.state, self.incumbent = state, incumbent
        self.costs = [t.cost.astype(np.float64) for t in problem.ops]
        self.mems = [t.memory.astype(np.float64) for t in problem.ops]
        self.best: tuple[int, tuple[int, ...]] | None = None
        self.bound = -math.inf if proven is None else float(proven)
        self.seen: list[set[int]] = [set() for _ in problem.ops]
        self.step_s = state.step_s  # the longest step: none is started that cannot end in time

    def at(self, lam: float) -> bool:
        """Solve L(lam); True when its plan fits the memory limit."""
        state, problem = self.state, self.state.problem
        began = time.perf_counter()
        unary = [c + lam * m for c, m in zip(self.costs, self.mems)]
        sol = solve_unary(problem, state.segments, unary, state.workers)
        self.step_s = max(self.step_s, time.perf_counter() - began)
        for i, s in enumerate(sol.choice):
            self.seen[i].add(s)
        memory = problem.memory(sol.choice)
        terms = len(problem.ops) + len(problem.edges)
        self.bound = max(self.bound, priced_bound(sol.value, lam * state.memory_limit, terms))
        if memory > state.memory_limit:
            return False
        self.offer(problem.objective(sol.choice), sol.choice)
        return True

    def offer(self, objective: int, choice: tuple[int, ...] | None) -> None:
        if choice is not None and (self.best is None or objective < self.best[0]):
            self.best = (objective, choice)

    def certified(self) -> bool:
        return self.best is not None and self.best[0] <= ceil_bound(self.bound)

    def beaten(self) -> bool:  # another condition's plan wins
        return self.incumbent is not None and self.bound > self.incumbent

    def done(self) -> bool:
        return self.certified() or self.state.left() <= self.step_s or self.beaten()


def lagrangian(
    state: SearchState, incumbent: int | None = None, proven: int | None = None
) -> Outcome:
    """The Lagrangian path (see the module text); ``proven``: a cut Pareto master's bound."""
    prices = _Prices(state, incumbent, proven)
    bisect_price(prices.at, prices.costs, prices.mems, prices.done)
    problem = state.problem
    lower = ceil_bound(prices.bound) if math.isfinite(prices.bound) else separable_bound(problem)
    if prices.beaten():
        return state.outcome("DOMINATED", None, incumbent, explanation="dominated")
    if prices.certified():
        return _finish(
            state,
            prices,
            "OPTIMAL",
            lower,
            f"memory binds: Lagrangian certificate (bound {lower} = objective)",
        )
    allowed = {i: sorted(s) for i, s in enumerate(prices.seen)}
    if state.left() > 0.5 + 2 * build_seconds(problem, allowed):
        # restricted master: CP-SAT mixes the priced solutions' strategies layer by layer
        best = prices.best
        master = solve(
            problem,
            state.memory_limit,
            state.left() / 2,
            state.seed,
            allowed=allowed,
            hint=best[1] if best else None,
            deadline=state.deadline,
        )
        prices.offer(master.objective, master.choice)
        if prices.certified():
            return _finish(
                state,
                prices,
                "OPTIMAL",
                lower,
                f"memory binds: restricted master certified by the Lagrangian bound {lower}",
            )
    return _close(state, prices, lower)


def _close(state: SearchState, prices: _Prices, lower: int) -> Outcome:
    """CP-SAT on the whole program, the plan in hand as hint and the bound as a cut."""
    problem, best = state.problem, prices.best
    if program_size(problem) > MAX_WHOLE_PROGRAM or state.left() <= 0.5 + 1.5 * build_seconds(
        problem
    ):
        why = (
            f"the whole program ({program_size(problem)} Booleans) is too large to close it"
            if program_size(problem) > MAX_WHOLE_PROGRAM
            else "the time limit ended the search"
        )
        return _finish(
            state,
            prices,
            "FEASIBLE" if best else "UNKNOWN",
            lower,
            f"memory binds: {gap(best, lower)} above the Lagrangian bound {lower}; {why}",
        )
    result = solve(
        problem,
        state.memory_limit,
        state.left(),
        state.seed,
        lower_bound=lower,
        hint=best[1] if best else None,
        deadline=state.deadline,
    )
    if result.choice is not None and (best is None or result.objective <= best[0]):
        prices.best = best = (result.objective, result.choice)
    if result.status == "OPTIMAL":
        return _finish(
            state,
            prices,
            "OPTIMAL",
            best[0] if best else lower,
            "memory binds: CP-SAT on the whole program proved the optimum",
        )
    lower = max(lower, result.bound or lower)
    return _finish(
        state,
        prices,
        "FEASIBLE" if best else result.status,
        lower,
        f"memory binds: {gap(best, lower)} above the proven bound {lower}; CP-SAT on the whole "
        f"program stopped at the time limit ({result.status})",
    )


def _finish(state: SearchState, prices: _Prices, status: str, lower: int, why: str) -> Outcome:
    best = prices.best
    return state.outcome(
        status, best[0] if best else None, lower, best[1] if best else None, note=why
    )


def bisect_price(at: Callable[[float], bool], costs, mems, done: Callable[[], bool]) -> None:
    """Find a feasible price by a x4 sweep, then bisect between infeasible and feasible prices
    (``prices.search_price`` with one price per pass: each is a whole decomposition solve)."""
    scale = max(1.0, sum(float(c.max()) for c in costs)) / max(
        1.0, sum(float(m.max()) for m in mems)
    )

    def fits(lams: np.ndarray) -> np.ndarray:
        return np.array([at(float(lam)) for lam in lams])

    search_price(
        fits, scale, 1, 80, lambda low, high, passes: done() or passes >= LAGRANGE_ITERATIONS
    )


def gap(best: tuple[int, tuple[int, ...]] | None, lower: int) -> str:
    """The plan's distance above the bound, in percent of the bound."""
    return f"{100.0 * (best[0] - lower) / max(1, lower):.2f}%" if best else "n/a"


def ceil_bound(bound: float) -> int:
    """The integer bound a float bound proves: float sums of up to ~1e4 integer-valued terms, so
    a relative rounding slack is allowed."""
    return int(math.ceil(bound - 1e-9 * abs(bound) - 1e-6))
