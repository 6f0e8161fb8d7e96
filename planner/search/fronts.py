"""Pareto fronts of (cost, memory) points, and the semiring (``ParetoFronts``) that reduces them.

Memory is additive over operators, so the plans of a segment for one (entry layout, exit layout)
pair are summed up, without loss, by the points no other plan beats in both cost and memory:

    series   (eliminate v between x and y):
             F[x,y][i,j] = front( U_k  F[x,v][i,k] (+) u[v][k] (+) F[v,y][k,j] )
    chain end (v has one neighbour x):
             u[x][i]     = u[x][i] (+) front( U_k F[x,v][i,k] (+) u[v][k] )
    parallel (two factors on one pair):
             F[i,j]      = front( F1[i,j] (+) F2[i,j] )

where (+) is the Minkowski sum of point sets and ``front`` keeps the non-dominated points (an exact
rule: a point goes only if another has no more cost and no more memory; of equal points one
stays). A network that is not series-parallel is conditioned exactly on one variable, as in
``planner.search.eliminate``. Every table is a ``Node`` that remembers what it was made of, so a
chosen point is traced back to the state of every variable (``explain``) by searching the (small)
fronts it was summed from. Costs and memory are integers held exactly in float64.

Arrays: a front table of shape S holds ``cost`` and ``mem`` of shape S + (K,), each row sorted by
memory (ascending) with strictly falling cost, padded with +inf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

CHUNK_ELEMENTS = 1 << 22


class FrontTooLarge(RuntimeError):
    """A front grew past the cap: the caller falls back to another exact method."""


def prune(cost: np.ndarray, mem: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-dominated points along the last axis, compacted; and their positions in the input."""
    finite = np.isfinite(cost) & np.isfinite(mem)
    cost, mem = np.where(finite, cost, np.inf), np.where(finite, mem, np.inf)
    order, by_memory = _memory_order(cost, mem, finite)
    c = np.take_along_axis(cost, order, axis=-1)
    best = np.minimum.accumulate(c, axis=-1)
    keep = np.isfinite(c)
    keep[..., 1:] &= c[..., 1:] < best[..., :-1]
    if by_memory:
        keep &= c == _group_min(c, np.take_along_axis(mem, order, axis=-1))
    width = max(1, int(keep.sum(axis=-1).max(initial=0)))
    if width > cap:
        raise FrontTooLarge(f"a Pareto front of {width} points (cap {cap})")
    slot = np.where(keep, np.cumsum(keep, axis=-1) - 1, width)
    out = []
    for values in (c, np.take_along_axis(mem, order, axis=-1), order):
        target = np.full(
            values.shape[:-1] + (width + 1,),
            np.inf if values is not order else -1,
            dtype=np.float64 if values is not order else np.int64,
        )
        np.put_along_axis(target, slot, values, axis=-1)
        out.append(target[..., :width])
    return out[0], out[1], out[2]


def _memory_order(cost: np.ndarray, mem: np.ndarray, finite: np.ndarray) -> tuple[np.ndarray, bool]:
    """Along the last axis, an order by (memory, position), infinite points last: one quicksort of
    unique integers (memory is a whole number of bytes), several times faster than the two-key
    stable sort by (memory, cost), which stays for memories too large for the integer key. The
    caller then keeps, of the points kept for one memory, the cheapest (``_group_min``): what the
    sort by cost would have kept."""
    count = cost.shape[-1]
    top = float(np.where(finite, mem, 0.0).max(initial=0.0)) + 2.0
    if top * count >= 2.0**62 or not cost.size:
        return np.lexsort((cost, mem), axis=-1), False
    key = np.where(finite, mem, top - 1.0).astype(np.int64) * count + np.arange(count)
    return np.argsort(key, axis=-1), True


def _group_min(c: np.ndarray, m: np.ndarray) -> np.ndarray:
    """For points sorted by memory along the last axis: the least cost among the points of equal
    memory in the same row, at each point."""
    flat_c, flat_m = c.reshape(-1, c.shape[-1]), m.reshape(-1, m.shape[-1])
    starts = np.ones(flat_c.shape, dtype=bool)
    starts[:, 1:] = flat_m[:, 1:] != flat_m[:, :-1]
    first = np.flatnonzero(starts.ravel())
    mins = np.minimum.reduceat(flat_c.ravel(), first)
    return np.repeat(mins, np.diff(np.append(first, flat_c.size))).reshape(c.shape)


@dataclass(frozen=True, slots=True, eq=False)
class Node:
    """A table of fronts (``cost``/``mem`` of shape S + (K,)) and how it was made (``how``)."""

    cost: np.ndarray
    mem: np.ndarray
    how: tuple

    @property
    def shape(self) -> tuple[int, ...]:
        return self.cost.shape[:-1]


def leaf(cost: np.ndarray, mem: np.ndarray | None = None) -> Node:
    """One point per entry (an operator's strategy, an edge's layout pair); inf cost = no point."""
    cost = np.asarray(cost, dtype=np.float64)
    mem = np.zeros_like(cost) if mem is None else np.asarray(mem, dtype=np.float64)
    cost = np.where(np.isfinite(cost), cost, np.inf)
    return Node(cost[..., None], np.where(np.isfinite(cost), mem, np.inf)[..., None], ("leaf",))


def add(a: Node, b: Node, cap: int) -> Node:
    """Elementwise Minkowski sum of two tables of the same shape (parallel factors)."""
    cost = (a.cost[..., :, None] + b.cost[..., None, :]).reshape(a.shape + (-1,))
    mem = (a.mem[..., :, None] + b.mem[..., None, :]).reshape(a.shape + (-1,))
    c, m, _ = prune(cost, mem, cap)
    return Node(c, m, ("add", a, b))


def transpose(a: Node) -> Node:
    return Node(a.cost.transpose(1, 0, 2), a.mem.transpose(1, 0, 2), ("transpose", a))


def series(var: int, left: Node, unary: Node, right: Node, cap: int) -> Node:
    """``front over k of left[i,k] (+) unary[k] (+) right[k,j]`` (eliminating a degree-2
    variable)."""
    nx, nv, ny = left.shape[0], left.shape[1], right.shape[1]
    mid_cost = (unary.cost[:, None, :, None] + right.cost[:, :, None, :]).reshape(nv, ny, -1)
    mid_mem = (unary.mem[:, None, :, None] + right.mem[:, :, None, :]).reshape(nv, ny, -1)
    mid_cost, mid_mem, _ = prune(mid_cost, mid_mem, cap)
    ka, km = left.cost.shape[-1], mid_cost.shape[-1]
    step = max(1, CHUNK_ELEMENTS // max(1, nv * ny * ka * km))
    costs, mems = [], []
    for start in range(0, nx, step):
        lc, lm = left.cost[start : start + step], left.mem[start : start + step]
        cost = lc[:, :, None, :, None] + mid_cost[None, :, :, None, :]  # [x, v, y, ka, km]
        mem = lm[:, :, None, :, None] + mid_mem[None, :, :, None, :]
        cost = cost.transpose(0, 2, 1, 3, 4).reshape(len(lc), ny, -1)
        mem = mem.transpose(0, 2, 1, 3, 4).reshape(len(lc), ny, -1)
        c, m, _ = prune(cost, mem, cap)
        costs.append(c)
        mems.append(m)
    width = max(c.shape[-1] for c in costs)
    pad = lambda arrays: np.concatenate(
        [
            np.pad(a, ((0, 0), (0, 0), (0, width - a.shape[-1])), constant_values=np.inf)
            for a in arrays
        ],
        axis=0,
    )
    return Node(pad(costs), pad(mems), ("series", var, left, unary, right))


def chain_end(var: int, left: Node, unary: Node, cap: int) -> Node:
    """``front over k of left[i,k] (+) unary[k]`` (eliminating a variable with one neighbour)."""
    nx, nv = left.shape
    cost = (left.cost[:, :, :, None] + unary.cost[None, :, None, :]).reshape(nx, -1)
    mem = (left.mem[:, :, :, None] + unary.mem[None, :, None, :]).reshape(nx, -1)
    c, m, _ = prune(cost, mem, cap)
    return Node(c, m, ("chain_end", var, left, unary))


def collapse(var: int, unary: Node, cap: int) -> Node:
    """``front over k of unary[k]`` (eliminating a variable with no neighbour): shape ()."""
    c, m, _ = prune(unary.cost.reshape(-1), unary.mem.reshape(-1), cap)
    return Node(c, m, ("collapse", var, unary))


def pick(a: Node, state: int) -> Node:
    """``a[state]`` of a unary table: the front of one fixed state (conditioning)."""
    return Node(a.cost[state], a.mem[state], ("pick", a, state))


def column(a: Node, state: int) -> Node:
    """``a[:, state]``: a factor's column once its second variable is fixed (conditioning)."""
    return Node(a.cost[:, state], a.mem[:, state], ("column", a, state))


def outer(rows: Node | None, cols: Node | None, const: Node, cap: int) -> Node:
    """``rows[i] (+) cols[j] (+) const`` as an [entry, exit] table (missing sides have one
    state)."""

    def as_matrix(node: Node | None, axis: int) -> Node:
        if node is None:
            return Node(np.zeros((1, 1, 1)), np.zeros((1, 1, 1)), ("none",))
        shape = (-1, 1) if axis == 0 else (1, -1)
        return Node(
            node.cost.reshape(shape + node.cost.shape[-1:]),
            node.mem.reshape(shape + node.mem.shape[-1:]),
            ("expand", node, axis),
        )

    r, c = as_matrix(rows, 0), as_matrix(cols, 1)
    n, m = r.shape[0], c.shape[1]
    cost = (
        r.cost[:, :, :, None, None]
        + c.cost[:, :, None, :, None]
        + const.cost[None, None, None, None, :]
    )
    mem = (
        r.mem[:, :, :, None, None]
        + c.mem[:, :, None, :, None]
        + const.mem[None, None, None, None, :]
    )
    cost = np.broadcast_to(cost, (n, m) + cost.shape[2:]).reshape(n, m, -1)
    mem = np.broadcast_to(mem, (n, m) + mem.shape[2:]).reshape(n, m, -1)
    cf, mf, _ = prune(cost, mem, cap)
    return Node(cf, mf, ("outer", r, c, const))


def union(var: int, branches: list[Node], cap: int) -> Node:
    """Points of any branch (one branch per state of a conditioned variable), pruned."""
    width = max(b.cost.shape[-1] for b in branches)
    pad = lambda a: np.pad(
        a, [(0, 0)] * (a.ndim - 1) + [(0, width - a.shape[-1])], constant_values=np.inf
    )
    cost = np.concatenate([pad(b.cost) for b in branches], axis=-1)
    mem = np.concatenate([pad(b.mem) for b in branches], axis=-1)
    c, m, _ = prune(cost, mem, cap)
    return Node(c, m, ("union", var, tuple(branches)))


class ParetoFronts:
    """The semiring of front tables for ``planner.search.eliminate.Network``: ``combine`` is the
    pruned Minkowski sum, minimising over a variable is the union of its states' fronts. Tables
    remember how they were made (``explain``), so no trace is returned."""

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def unit(self) -> Node:
        return leaf(np.zeros(()))

    def combine(self, a: Node, b: Node) -> Node:
        return add(a, b, self.cap)

    def transpose(self, a: Node) -> Node:
        return transpose(a)

    def series(self, var: int, left: Node, unary: Node, right: Node) -> tuple[Node, None]:
        return series(var, left, unary, right, self.cap), None

    def chain_end(self, var: int, left: Node, unary: Node) -> tuple[Node, None]:
        return chain_end(var, left, unary, self.cap), None

    def collapse(self, var: int, unary: Node) -> tuple[Node, None]:
        return collapse(var, unary, self.cap), None

    def pick(self, unary: Node, state: int) -> Node:
        return pick(unary, state)

    def column(self, factor: Node, state: int) -> Node:
        return column(factor, state)

    def boundary(self, rows: Node | None, cols: Node | None, const: Node) -> Node:
        return outer(rows, cols, const, self.cap)

    def union(self, var: int, tables: list[Node]) -> tuple[Node, None]:
        return union(var, tables, self.cap), None

    def states(self, unary: Node) -> int:
        return unary.shape[0]


def explain(node: Node, index: tuple[int, ...], point: int, states: dict[int, int]) -> None:
    """Trace point ``point`` of entry ``index`` back to the state of every variable that was
    eliminated or conditioned on its way (written into ``states``)."""
    stack = [(node, tuple(index), float(node.cost[index][point]), float(node.mem[index][point]))]
    while stack:
        node, index, cost, mem = stack.pop()
        kind, *parts = node.how
        if kind in ("leaf", "none"):
            continue
        if kind == "transpose":
            stack.append((parts[0], index[::-1], cost, mem))
        elif kind == "column":
            stack.append((parts[0], index + (parts[1],), cost, mem))
        elif kind == "pick":
            stack.append((parts[0], (parts[1],) + index, cost, mem))
        elif kind == "expand":
            stack.append((parts[0], (index[parts[1]],), cost, mem))
        elif kind == "union":
            var, branches = parts
            state = next(
                s
                for s, b in enumerate(branches)
                if _position(b.cost[index], b.mem[index], cost, mem) >= 0
            )
            states[var] = state
            stack.append((branches[state], index, cost, mem))
        else:
            stack.extend(_split(kind, parts, index, cost, mem, states))


def _position(costs: np.ndarray, mems: np.ndarray, cost: float, mem: float) -> int:
    hits = np.flatnonzero((costs == cost) & (mems == mem))
    return int(hits[0]) if len(hits) else -1


def _split(
    kind: str, parts: list, index: tuple, cost: float, mem: float, states: dict[int, int]
) -> list:
    """The operand entries whose points sum to (cost, mem), for the summing node kinds."""
    if kind == "add":
        a, b = parts
        operands = [(a, index), (b, index)]
        slices = [(a.cost[index], a.mem[index]), (b.cost[index], b.mem[index])]
    elif kind == "outer":
        r, c, const = parts
        operands = [(r, (index[0], 0)), (c, (0, index[1])), (const, ())]
        slices = [(n.cost[i], n.mem[i]) for n, i in operands]
    else:
        var, *nodes = parts
        for k in range(nodes[1].shape[0] if kind == "series" else nodes[-1].shape[0]):
            found = _match(_eliminated_operands(kind, nodes, index, k), cost, mem)
            if found is not None:
                states[var] = k
                return found
        raise RuntimeError(f"no decomposition of point ({cost}, {mem}) in a {kind} node")
    found = _match(operands, cost, mem, slices)
    if found is None:
        raise RuntimeError(f"no decomposition of point ({cost}, {mem}) in a {kind} node")
    return found


def _eliminated_operands(kind: str, nodes: list, index: tuple, k: int) -> list:
    """The operand entries a series / chain-end / collapse node summed for state k of its
    variable."""
    if kind == "series":
        return [(nodes[0], (index[0], k)), (nodes[1], (k,)), (nodes[2], (k, index[1]))]
    if kind == "chain_end":
        return [(nodes[0], (index[0], k)), (nodes[1], (k,))]
    return [(nodes[0], (k,))]


def _match(operands: list, cost: float, mem: float, slices: list | None = None) -> list | None:
    """Points, one per operand entry, that sum exactly to (cost, mem); None if there are none."""
    slices = slices or [(n.cost[i], n.mem[i]) for n, i in operands]
    total_c, total_m = np.zeros(()), np.zeros(())
    for c, m in slices:
        total_c = np.add.outer(total_c, c)
        total_m = np.add.outer(total_m, m)
    hits = np.argwhere((total_c == cost) & (total_m == mem))
    if not len(hits):
        return None
    picks = hits[0]
    return [(n, i, float(c[p]), float(m[p])) for (n, i), (c, m), p in zip(operands, slices, picks)]


def mode_chain(
    by_mode: Sequence[Sequence[Node]], units: Sequence[int], keys: Sequence[str]
) -> list[Node]:
    """One chain choosing a mode per unit: segment k's points are those of every mode's table side
    by side (mode v's block at ``block_offsets``), and a boundary inside a unit carries the mode
    (state ``layout * modes + mode``), so the unit's next segment takes the same one; a boundary
    between units is a layout alone (any mode may follow). Equal segments (``keys``) in the same
    place of their units share one table."""
    count, out, made = len(by_mode), [], {}
    for k in range(len(by_mode[0])):
        fresh, carries = unit_edges(units, k)
        if (keys[k], fresh, carries) in made:
            out.append(made[keys[k], fresh, carries])
            continue
        offsets = block_offsets(by_mode, k)
        na, nb = by_mode[0][k].shape
        cost = np.full(
            (na if fresh else na * count, nb * count if carries else nb, offsets[-1]), np.inf
        )
        mem = np.full_like(cost, np.inf)
        for v, tables in enumerate(by_mode):
            t, block = tables[k], slice(offsets[v], offsets[v + 1])
            # inside a unit: the mode it came with
            rows = slice(None) if fresh else slice(v, None, count)
            cols = slice(v, None, count) if carries else slice(None)
            cost[rows, cols, block], mem[rows, cols, block] = t.cost, t.mem
        made[keys[k], fresh, carries] = Node(cost, mem, ("modes", k))
        out.append(made[keys[k], fresh, carries])
    return out


def unit_edges(units: Sequence[int], k: int) -> tuple[bool, bool]:
    """Whether segment k starts its unit, and whether the unit goes on after it."""
    return k == 0 or units[k] != units[k - 1], k + 1 < len(units) and units[k + 1] == units[k]


def block_offsets(by_mode: Sequence[Sequence[Node]], k: int) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([tables[k].cost.shape[-1] for tables in by_mode])])
