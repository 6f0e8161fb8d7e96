"""The label sets of the Pareto master (``planner.search.pareto``): the (label, point) pairs of a
boundary that can still pass the bound, then per boundary state the non-dominated ones sorted by
memory, as padded [state, label] arrays. Vectorised with numpy: a boundary holds up to
``LABEL_CAP`` labels per state."""

from __future__ import annotations

import math

import numpy as np

from planner.search.fronts import FrontTooLarge, Node


def candidates(
    cost, mem, live, table: Node, reach: np.ndarray, limit: float, price: float, upper: float
) -> tuple[np.ndarray, ...]:
    """The (label, point) pairs that can pass ``price``'s bound, as (exit state, source, cost,
    memory); the source indexes the dense [live entry state, label, point] array. The bound is
    linear in (cost + price * memory) of label and point, so per entry state the labels sorted by it
    give each point's partners as a prefix; only those pairs are built (a superset: the caller
    applies every bound exactly)."""
    kl, kt = cost.shape[1], table.cost.shape[2]
    margin = 1.0 + 1e-6 * (abs(upper) + abs(price * limit)) if upper < math.inf else math.inf
    parts = []
    for ai, a in enumerate(live):
        finite = np.flatnonzero(np.isfinite(cost[a]))
        weight = cost[a, finite] + price * mem[a, finite]
        order = np.argsort(weight, kind="stable")
        # [exit state, point], flat; only the finite points can have partners (the padding of
        # the fronts and the states that cannot finish have none)
        point = (table.cost[a] + (price * table.mem[a] if price else 0.0) + reach[:, None]).ravel()
        ok = np.flatnonzero(np.isfinite(point))
        room = upper + margin + price * limit - point[ok]
        counts = np.searchsorted(weight[order], room, side="right")
        flat = np.repeat(ok, counts)
        label = finite[order[np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)]]
        b, q = np.divmod(flat, kt)
        parts.append(
            (
                b,
                (ai * kl + label) * kt + q,
                cost[a, label] + table.cost[a, b, q],
                mem[a, label] + table.mem[a, b, q],
            )
        )
    if not parts:
        return tuple(np.zeros(0, dtype=d) for d in (np.int64, np.int64, np.float64, np.float64))
    return tuple(np.concatenate(arrays) for arrays in zip(*parts))


def fronts_by_row(rows, cols, c, m, bound, nb: int, label_cap: int, beam: int | None) -> tuple:
    """Per row (boundary state), the non-dominated candidates sorted by memory; with ``beam``, only
    the ``beam`` of least bound. Rows are told apart by an offset larger than any cost range, so
    one running minimum serves every row (integers below 2^53: exact)."""
    if not len(c):
        return rows, cols, c, m, bound
    order, key = _by_state_and_memory(rows, m, c, nb)
    # the filter reads the rows and costs in that order; the five arrays are gathered once, at
    # the positions it keeps
    state, cost = rows[order], c[order]
    span = float(cost.max() - cost.min()) + 1.0
    shifted = (cost - cost.min()) + (nb - state) * span
    keep = np.ones(len(cost), dtype=bool)
    keep[1:] = shifted[1:] < np.minimum.accumulate(shifted)[:-1]
    if key is not None:
        # sorted by (state, memory, position) only: of the points kept for one (state, memory),
        # each is cheaper than the one before, so the last is the one a sort by cost would keep
        kept = np.flatnonzero(keep)
        sorted_key = key[order[kept]]
        keep[kept[:-1][sorted_key[:-1] == sorted_key[1:]]] = False
    at = order[keep]
    rows, cols, c, m, bound = rows[at], cols[at], c[at], m[at], bound[at]
    counts = np.bincount(rows, minlength=nb)
    if beam is not None and counts.max() > beam:
        by_bound = np.lexsort((bound, rows))
        rank = np.arange(len(rows)) - np.searchsorted(rows[by_bound], rows[by_bound])
        chosen = np.sort(by_bound[rank < beam])
        rows, cols, c, m, bound = rows[chosen], cols[chosen], c[chosen], m[chosen], bound[chosen]
    elif counts.max() > label_cap:
        raise FrontTooLarge(f"{int(counts.max())} labels at one boundary layout (cap {label_cap})")
    return rows, cols, c, m, bound


def _by_state_and_memory(rows, m, c, nb: int) -> tuple[np.ndarray, np.ndarray | None]:
    """An order by (state, memory, cost, position); or by (state, memory, position) and that key,
    one stable sort of int64s (a tenth of the time), when it fits: the same result once the
    caller keeps the cheapest point per key. (The stable sort is the order of the unique keys
    key * n + position, in half the time: the candidates come in runs it merges.)"""
    top = float(m.max()) + 1.0
    if nb * top * len(m) < 2.0**62 and nb * top < 2.0**53:
        # integers held exactly in float64
        key = rows.astype(np.int64) * int(top) + m.astype(np.int64)
        return np.argsort(key, kind="stable"), key
    return np.lexsort((c, m, rows)), None


def as_table(rows, nb: int, c, m, cols) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-sorted candidates as [state, label] arrays padded with inf (and -1 sources)."""
    counts = np.bincount(rows, minlength=nb)
    width = max(1, int(counts.max(initial=0)))
    slot = np.arange(len(rows)) - np.searchsorted(rows, rows)
    cost, mem = np.full((nb, width), np.inf), np.full((nb, width), np.inf)
    # the sources are kept for every boundary of the chain: the narrowest integers that hold them
    wide = len(cols) and int(cols.max()) >= 2**31 - 1
    src = np.full((nb, width), -1, dtype=np.int64 if wide else np.int32)
    cost[rows, slot], mem[rows, slot], src[rows, slot] = c, m, cols
    return cost, mem, src
