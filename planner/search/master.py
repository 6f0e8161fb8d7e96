"""The Pareto phase of the exact search (``planner.search.exact``): memory binds, or ZeRO is
chosen per layer, so the Pareto tables and label-setting master of ``planner.search.pareto`` run,
with the layer choices of ``planner.search.layer_modes``. Its outcomes: OPTIMAL (the master
finished), FEASIBLE with the proven Lagrangian bound (cut after a beam pass), DOMINATED (another
tied condition's plan wins), or None: the master could not run and the Lagrangian path goes on."""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.search.fronts import FrontTooLarge
from planner.search.lagrangian import gap
from planner.search.layer_modes import layer_modes, layer_options
from planner.search.pareto import Dominated, NoLabelFits, ParetoResult, Unproven, pareto_search
from planner.search.state import Outcome, SearchState

PARETO_SHARE = 0.5  # of the time limit: the Pareto master's; the Lagrangian path keeps the rest.
# Beside a plan in hand (another tied condition's) the master settles a condition (proves it
# dominated) sooner than the Lagrangian path and gets it all; with per-layer choices a cut master's
# bound is kept and the second sweep of the conditions settles it faster (41.6 s against 56.8 s)


@dataclass(frozen=True, slots=True)
class MasterRun:
    """What the Pareto master did: a proven plan (``proven`` None), a cut master's beam plan or
    None with the bound it proved, or no plan with why (``dominated``: another condition wins)."""

    plan: ParetoResult | None
    why: str
    proven: int | None = None
    dominated: bool = False


def pareto_phase(state: SearchState) -> Outcome | None:
    """Memory binds, or ZeRO is chosen per layer: the Pareto master, with the layer choices."""
    problem, free = state.problem, state.free
    options = state.options = state.options or layer_options(
        problem, state.segments, state.shared().variants
    )
    # no limit: one no plan can reach (finite, so that prices times memory stay numbers)
    limit = (
        state.memory_limit
        if math.isfinite(state.memory_limit)
        else 1.0
        + max(sum(int(t.memory.max()) for t in p.ops) for p in (problem, *options.variants))
    )
    share = 1.0 if state.incumbent is not None and not options.variants else PARETO_SHARE
    run = _pareto(state, limit, state.start + share * (state.deadline - state.start))
    why, proven = run.why, run.proven
    if run.dominated:  # no plan here beats another condition's (planner.search.ties)
        return state.outcome("DOMINATED", None, state.incumbent, explanation=why, note=why)
    if run.plan is None and state.fits:  # the choices could not be searched: the free plan stands
        status = "OPTIMAL" if not options.variants else "FEASIBLE"
        return state.outcome(status, problem.objective(free.choice), proven, free.choice, note=why)
    if state.fits and run.plan is not None:
        why = why.replace("memory binds: ", "memory free: ", 1)
    if run.plan is not None or (options.variants and proven is not None):
        return _from_pareto(state, run.plan, why, proven)
    if options.variants:
        why += (
            "; choices per layer need the Pareto master: every layer runs without recompute at "
            "ZeRO stage 0"
        )
    # with layer choices the bound is the restricted problem's: no proof against an incumbent
    state.notes += (why,)
    state.proven = None if options.variants else proven
    return None


def _from_pareto(
    state: SearchState, found: ParetoResult | None, why: str, proven: int | None
) -> Outcome:
    """The master's plan: OPTIMAL when proven, FEASIBLE with the Lagrangian bound when the master
    was cut after a beam pass; with per-layer choices and no plan, UNKNOWN with that bound (the
    Lagrangian path would search without the choices: its bound would be no bound of this one)."""
    if found is None:
        return state.outcome("UNKNOWN", None, proven, explanation=why, note=why)
    recompute, zero = layer_modes(state.problem, state.segments, found.modes, state.options)
    status, bound = ("OPTIMAL", found.objective) if proven is None else ("FEASIBLE", proven)
    return state.outcome(
        status,
        found.objective,
        bound,
        found.choice,
        note=why,
        layer_recompute=recompute,
        layer_zero=zero,
    )


def _pareto(state: SearchState, limit: float, deadline: float) -> MasterRun:
    """The exact Pareto master under ``limit`` until ``deadline`` (see ``MasterRun``)."""
    options = state.options
    chosen = options.describe() if options.variants else ""
    try:
        found = pareto_search(
            state.problem,
            state.segments,
            limit,
            deadline,
            variants=options.variants,
            units=options.units,
            tables=state.shared().fronts,
            incumbent=state.incumbent,
        )
    except Dominated as exc:
        return MasterRun(None, f"dominated: {exc}", dominated=True)
    except Unproven as exc:
        if exc.plan is None:
            return MasterRun(
                None, f"memory binds: the exact Pareto master stopped ({exc}){chosen}", exc.bound
            )
        return MasterRun(
            exc.plan,
            (
                f"memory binds: the exact Pareto master stopped ({exc}); the best beam pass's "
                f"plan, {gap((exc.plan.objective, ()), exc.bound)} above the Lagrangian bound "
                f"{exc.bound}{chosen}"
            ),
            exc.bound,
        )
    except (FrontTooLarge, NoLabelFits, TimeoutError) as exc:
        return MasterRun(
            None,
            f"memory binds: Pareto tables stopped ({exc}); Lagrangian pricing and CP-SAT instead",
        )
    return MasterRun(
        found,
        (
            "memory binds: exact Pareto tables and label-setting master (fronts of up to "
            f"{found.table_points} points, up to {found.max_labels} labels per layout; Lagrangian "
            f"bound {found.lagrangian_bound}){chosen}"
        ),
    )
