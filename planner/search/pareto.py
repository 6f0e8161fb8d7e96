"""Exact search under a memory limit: Pareto segment tables and a label-setting master
(docs/formulations.md, The Pareto master).

Each distinct segment is reduced once into a table of Pareto fronts: for every (entry layout, exit
layout) pair, the non-dominated (cost, memory) points of its plans (``planner.search.fronts``).
The segments form a chain, so the program is a resource-constrained shortest path:

    labels at boundary k, layout b:  front( U_{a, p in labels[k-1][a], q in T_k[a,b]}  p (+) q )

kept only while they can still lead to a fitting plan better than the incumbent:

    memory:  m + minmem_k(b) <= M
    cost:    c + R0_k(b) <= UB  and  c + Rlam_k(b) - lam (M - m) <= UB

(minmem_k: least memory to finish; R0_k, Rlam_k: least cost, and least cost + lam * memory, to
finish; valid since the rest uses at most M - m bytes)

with lam and UB from a Lagrangian bisection over the same tables. No label that can reach an
optimum is dropped, so the cheapest label at the last boundary is the optimum of the whole program
(OPTIMAL, no solver gap); its back-pointers give each segment's point, and ``explain`` gives every
operator's strategy. Fronts or labels past their caps raise ``FrontTooLarge`` (the caller falls
back to the Lagrangian + CP-SAT path).

Recompute and ZeRO chosen per layer (``fronts.mode_chain``): with the tables of each mode (the graph
costed with every layer in that mode), a segment's points are every mode's side by side, and a
boundary inside a unit (a layer) carries the mode so that the unit's segments agree; the same
label-setting then picks each layer's mode with its strategies, exactly, since memory and cost
stay additive over segments.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.cost.problem import Problem
from planner.search.decompose import Segment, segment_keys, segment_network
from planner.search.eliminate import Network
from planner.search.labels import as_table, candidates, fronts_by_row
from planner.search.prices import kept_lagrangian, suffix
from planner.search.fronts import (
    FrontTooLarge,
    Node,
    ParetoFronts,
    block_offsets,
    explain,
    leaf,
    mode_chain,
    unit_edges,
)

FRONT_CAP = 512  # points per front in a segment table
LABEL_CAP = 16384  # labels per boundary layout in the master
BEAMS = (1, 8, 64)  # labels per boundary layout in the heuristic passes that set the upper bound


@dataclass(frozen=True, slots=True)
class ParetoResult:
    """The optimum under the memory limit: integer objective, memory, choice, and search sizes."""

    objective: int
    memory: int
    choice: tuple[int, ...]
    table_points: int  # the largest front of any segment table
    max_labels: int  # the most labels kept at one boundary
    lagrangian_bound: int
    seconds: float
    # per segment, the settings it runs under (0: the problem's; i: variant i)
    modes: tuple[int, ...] = ()


class Dominated(Exception):
    """No plan of this problem costs less than the incumbent the caller gave: nothing to return."""


class NoLabelFits(Exception):
    """No label reached the last boundary within the memory limit (with no plan in hand to prune
    by, the problem is infeasible; the caller's exact path proves and reports it)."""


class Unproven(Exception):
    """The master was cut (caps, deadline) after its Lagrangian ``bound`` was proven; ``plan``:
    the best beam pass's (it fits, unproven) or None."""

    def __init__(self, plan: "ParetoResult | None", bound: int, why: str) -> None:
        super().__init__(why)
        self.plan, self.bound = plan, bound


def segment_front_table(problem: Problem, seg: Segment, cap: int = FRONT_CAP) -> Node:
    """The [entry layout, exit layout] table of (cost, memory) fronts of one segment."""
    costs = [t.cost.astype(np.float64) for t in problem.ops]
    net, entry, exit_ = segment_network(problem, seg, costs)
    memory = [problem.ops[op].memory.astype(np.float64) for op in seg.ops]
    unary = [leaf(u, memory[n] if n < len(seg.ops) else None) for n, u in enumerate(net.unary)]
    fronts = Network(unary, ParetoFronts(cap))
    for (x, y), matrix in sorted(net.factors.items()):
        fronts.add_factor(x, y, leaf(matrix))
    return fronts.reduce(entry, exit_).table


def pareto_search(
    problem: Problem,
    segments: Sequence[Segment],
    memory_limit: float,
    deadline: float | None = None,
    cap: int = FRONT_CAP,
    label_cap: int = LABEL_CAP,
    variants: Sequence[Problem] = (),
    units: Sequence[int] = (),
    tables: dict | None = None,
    incumbent: float | None = None,
) -> ParetoResult:
    """The exact optimum under ``memory_limit`` over a chain of segments (see the module text).

    ``variants``: the graph costed under other settings (recompute modes, ZeRO stages), one chosen
    per unit of consecutive segments (``units``: a unit id per segment; ``ParetoResult.modes``).
    ``tables``: front tables kept by (option, cap, segment key) across calls whose problems differ
    in some segments only (tied-layout conditions); ``incumbent``: the cost of a plan found
    elsewhere, which prunes the labels. Raises ``FrontTooLarge`` past the caps, ``Dominated`` when
    no plan here beats the incumbent, ``NoLabelFits`` when none fits, ``TimeoutError`` past
    ``deadline``."""
    start = time.perf_counter()
    options = [problem, *variants]
    by_mode, chain = _chain(options, segments, cap, units, tables, deadline)
    limit = float(memory_limit)
    lam, upper, bound = kept_lagrangian(chain, limit, lambda: _check(deadline), tables)
    if incumbent is not None and bound > incumbent:
        raise Dominated(
            f"its Lagrangian bound {bound:.0f} exceeds the plan in hand ({incumbent:.0f})"
        )
    upper = min(upper, incumbent if incumbent is not None else math.inf)
    heuristic = None  # the best beam pass: a plan that fits, kept in case the exact pass is cut
    try:
        # an incumbent from another condition is the upper bound already: no beam pass for it
        for beam in BEAMS if incumbent is None else ():
            passed = _master(chain, limit, lam, upper, label_cap, deadline, beam=beam)
            if passed[1] is not None and passed[2] < upper:
                upper, heuristic = passed[2], passed
        back, final, best = _master(chain, limit, lam, upper, label_cap, deadline)
    except (FrontTooLarge, TimeoutError) as exc:
        plan = (
            None
            if heuristic is None
            else _result(options, segments, by_mode, units, heuristic, memory_limit, bound, start)
        )
        raise Unproven(plan, int(math.ceil(bound - 1e-6)), str(exc)) from None
    found = _settled((back, final, best), heuristic, incumbent, upper)
    return _result(options, segments, by_mode, units, found, memory_limit, bound, start)


def _settled(exact: tuple, heuristic: tuple | None, incumbent: float | None, upper: float):
    """The exact pass's plan, or the beam's when the exact pass proved nothing beats it; raises
    when no plan here fits or beats the incumbent."""
    back, final, best = exact
    if final is None and heuristic is not None and best >= heuristic[2]:
        return heuristic  # the exact pass proved no plan beats the beam's
    if final is None and incumbent is not None and upper >= incumbent:
        raise Dominated(f"no label beats the plan in hand ({incumbent:.0f})")
    if final is None:
        raise NoLabelFits("no label fits the memory limit")
    return exact


def _result(
    options: Sequence[Problem],
    segments: Sequence[Segment],
    by_mode,
    units: Sequence[int],
    passed: tuple,
    memory_limit: float,
    bound: float,
    start: float,
) -> ParetoResult:
    """A master pass's plan (``options[0]`` the problem, the rest its variants), re-costed
    operator by operator against its label."""
    back, final, best = passed
    problem = options[0]
    choice, modes = _recover(segments, by_mode, len(problem.ops), back, final, units)
    tables_of = [options[mode].ops[op] for seg, mode in zip(segments, modes) for op in seg.ops]
    chosen = [choice[op] for seg in segments for op in seg.ops]
    edges = problem.objective(choice) - sum(int(t.cost[c]) for t, c in zip(problem.ops, choice))
    objective = edges + sum(int(t.cost[c]) for t, c in zip(tables_of, chosen))
    memory = sum(int(t.memory[c]) for t, c in zip(tables_of, chosen))
    if memory > memory_limit or objective != int(round(best)):
        raise RuntimeError(
            f"Pareto master: the plan costs {objective} with {memory} bytes, its label {best}"
        )
    widest = max(t.cost.shape[-1] for tables_of_mode in by_mode for t in tables_of_mode)
    return ParetoResult(
        objective,
        memory,
        tuple(choice),
        widest,
        max(b.src.shape[1] for b in back),
        int(math.ceil(bound - 1e-6)),
        time.perf_counter() - start,
        tuple(modes),
    )


def lagrangian_bound(
    problem: Problem,
    segments: Sequence[Segment],
    memory_limit: float,
    deadline: float | None = None,
    cap: int = FRONT_CAP,
    variants: Sequence[Problem] = (),
    units: Sequence[int] = (),
    tables: dict | None = None,
) -> float:
    """A lower bound on ``pareto_search``'s optimum: the best Lagrangian bound of its chain,
    max over prices lam of (least cost + lam * memory) - lam * limit (the same tables, so the
    tables it builds serve the search after it). Raises as ``pareto_search`` does."""
    _, chain = _chain([problem, *variants], segments, cap, units, tables, deadline)
    return kept_lagrangian(chain, float(memory_limit), lambda: _check(deadline), tables)[2]


def _chain(
    options: Sequence[Problem],
    segments: Sequence[Segment],
    cap: int,
    units: Sequence[int],
    known: dict | None,
    deadline: float | None,
) -> tuple[list[list[Node]], list[Node]]:
    """Each option's front table per segment (kept in ``known`` by (option, cap, the segment's
    content key under that option)), and the chain the master walks (the modes side by side when
    there are several options)."""
    known = known if known is not None else {}
    keys = [[s.key for s in segments]] + [list(segment_keys(o, segments)) for o in options[1:]]
    for n, seg in enumerate(segments):
        for k, option in enumerate(options):
            if (k, cap, keys[k][n]) not in known:
                known[(k, cap, keys[k][n])] = segment_front_table(option, seg, cap)
                _check(deadline)
    by_mode = [[known[(k, cap, key)] for key in keys[k]] for k in range(len(options))]
    together = ["/".join(parts) for parts in zip(*keys)]  # equal in every mode: one table
    chain = by_mode[0] if len(options) == 1 else mode_chain(by_mode, units, together)
    return by_mode, chain


def _check(deadline: float | None) -> None:
    if deadline is not None and time.perf_counter() > deadline:
        raise TimeoutError("the time limit ended the Pareto search")


def _master(
    chain: Sequence[Node],
    limit: float,
    lam: float,
    upper: float,
    label_cap: int,
    deadline: float | None,
    beam: int | None = None,
) -> tuple[list, tuple[int, int] | None, float]:
    """Label-setting over the chain: back-pointers per boundary, the optimal final label and its
    cost. With ``beam`` each boundary state keeps only that many labels, those of least bound:
    a fast heuristic whose plan still fits (it gives the exact pass its upper bound)."""
    # the strongest first
    prices = list(dict.fromkeys((lam, 0.0, lam / 2, 2 * lam, lam / 4, 4 * lam)))
    least_memory = suffix(chain, None)
    priced = {price: suffix(chain, price) for price in prices}
    # float rounding, in objective units
    slack = 1.0 + 1e-9 * abs(upper) if upper < math.inf else math.inf
    cost, mem = np.zeros((1, 1)), np.zeros((1, 1))
    back = []
    for k, table in enumerate(chain):
        _check(deadline)
        # boundary states that still hold labels
        live = np.flatnonzero(np.isfinite(cost).any(axis=1))
        kl, kt = cost.shape[1], table.cost.shape[2]
        rows, cols, c, m = candidates(
            cost, mem, live, table, priced[prices[0]][k + 1], limit, prices[0], upper
        )
        fits = m + least_memory[k + 1][rows] <= limit
        rows, cols, c, m = rows[fits], cols[fits], c[fits], m[fits]
        bound = np.full(len(rows), -np.inf)
        for price in prices:  # each price's bound only on the candidates the earlier ones kept
            bound = np.maximum(bound, c + priced[price][k + 1][rows] - price * (limit - m))
            keep = bound <= upper + slack
            rows, cols, c, m, bound = rows[keep], cols[keep], c[keep], m[keep], bound[keep]
        nb = table.shape[1]
        rows, cols, c, m, bound = fronts_by_row(rows, cols, c, m, bound, nb, label_cap, beam)
        cost, mem, src = as_table(rows, nb, c, m, cols)
        back.append(_Back(live, (max(1, len(live)), kl, kt), src))
    if not np.isfinite(cost[0]).any():
        return back, None, math.inf
    last = int(np.where(np.isfinite(cost[0]), cost[0], np.inf).argmin())
    return back, (0, last), float(cost[0, last])


@dataclass(frozen=True, slots=True)
class _Back:
    """One boundary's back-pointers: per [state, label], the index of its (live entry state,
    label, point) in the dense array of that shape, -1 for padding; decoded only on the path
    recovered (a boundary holds up to states x LABEL_CAP labels: one array, not four)."""

    live: np.ndarray
    shape: tuple[int, int, int]
    src: np.ndarray

    def source(self, state: int, label: int) -> tuple[int, int, int]:
        """(entry state, label at the boundary before, point of the table) of one label."""
        flat = int(self.src[state, label])
        if flat < 0:
            raise RuntimeError("Pareto master: a back-pointer leads nowhere")
        a, p, q = np.unravel_index(flat, self.shape)
        return int(self.live[a]) if len(self.live) else int(a), int(p), int(q)


def _recover(
    segments: Sequence[Segment],
    by_mode: Sequence[Sequence[Node]],
    num_ops: int,
    back: list,
    final: tuple[int, int],
    units: Sequence[int],
) -> tuple[list[int], list[int]]:
    """Each segment's (entry, exit, point) and mode from the back-pointers, then each operator's
    strategy (several modes: see ``mode_chain`` for the states and the point blocks)."""
    count = len(by_mode)
    choice, modes = [-1] * num_ops, [0] * len(segments)
    state, label = final
    explained: dict[tuple, dict[int, int]] = {}
    for k in range(len(segments) - 1, -1, -1):
        a, p, q = back[k].source(state, label)
        entry, exit_, point, mode = int(a), state, int(q), 0
        if count > 1:
            fresh, carries = unit_edges(units, k)
            offsets = block_offsets(by_mode, k)
            mode = int(np.searchsorted(offsets, point, side="right")) - 1
            entry, exit_, point = (
                entry if fresh else entry // count,
                exit_ // count if carries else exit_,
                point - int(offsets[mode]),
            )
        seg, modes[k] = segments[k], mode
        key = (mode, id(by_mode[mode][k]), entry, exit_, point)
        if key not in explained:
            states: dict[int, int] = {}
            explain(by_mode[mode][k], (entry, exit_), point, states)
            explained[key] = states
        for n, op in enumerate(seg.ops):
            choice[op] = explained[key][n]
        state, label = int(a), int(p)
    return choice, modes
