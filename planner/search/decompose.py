"""Homomorphism decomposition (docs/formulations.md, The decomposition): exact segment tables
merged by (min,+) products.

A *single-tensor cut* is a position in the topological order where exactly one tensor crosses
from earlier to later operators. Cutting at every cut turns the model into segments
``g1 ++ g2 ++ ... ++ gL``; the state between two segments is the producer layout of the cut
tensor. ``C_g[i,j]`` (see ``planner.search.eliminate``) is the optimal cost of segment g with entry
layout i and exit layout j, so the optimum of the model is

    min over boundary layouts of  C_g1 (*) C_g2 (*) ... (*) C_gL,
    (A (*) B)[i,j] = min_k A[i,k] + B[k,j]

The product is associative: identical segments (same canonical hash) are reduced once, segments
of one layer are multiplied into a layer table, and a run of r identical layers is raised to the
r-th power by repeated squaring (O(log r) products). Argmins of every product are kept, so the
plan of every operator is reconstructed. Costs are integers held exactly in float64 (< 2^53).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from planner.search.eliminate import Network, minplus
from planner.cost.problem import Problem
from planner.search.segment_hash import content_key, edges_by_dst


@dataclass(frozen=True, slots=True)
class Segment:
    """Operators ``ops`` (problem indices) between two cuts; entry/exit are cut edges' tensors."""

    ops: tuple[int, ...]
    entry_tensor: str | None
    exit_tensor: str | None
    exit_producer: int | None  # problem index of the op producing the exit tensor
    key: str
    layer: int | None


def find_cuts(problem: Problem) -> list[tuple[int, str]]:
    """Positions i (cut after op i) where exactly one tensor crosses, and that tensor."""
    outgoing: dict[int, list[str]] = {}
    incoming: dict[int, list[str]] = {}
    for e in problem.edges:
        outgoing.setdefault(e.src, []).append(e.tensor)
        incoming.setdefault(e.dst, []).append(e.tensor)
    pending: dict[str, int] = {}
    cuts = []
    last = None
    for i in range(len(problem.ops)):
        for t in incoming.get(i, ()):
            pending[t] -= 1
            if not pending[t]:
                del pending[t]
        for t in outgoing.get(i, ()):
            pending[t] = pending.get(t, 0) + 1
        if len(pending) == 1 and i < len(problem.ops) - 1:
            (tensor,) = pending
            if tensor != last:  # a tensor crossing two cuts in a row is no new boundary
                cuts.append((i, tensor))
                last = tensor
    return cuts


def split_segments(problem: Problem) -> tuple[Segment, ...]:
    """The segments between consecutive single-tensor cuts, each with a canonical content hash.
    A copy of a problem (conditioned, restricted: ``Problem.digests`` is shared) re-hashes only
    the segments holding an operator whose table or incoming edges it replaced."""
    # the cuts depend on the edges' ends alone: a problem's copies share them
    shape = ("cuts", len(problem.ops), tuple((e.src, e.dst, e.tensor) for e in problem.edges))
    if shape not in problem.digests:
        problem.digests[shape] = (find_cuts(problem), None)
    cuts, first = problem.digests[shape]
    if first is not None:
        return _patched(problem, *first)
    segments = _segments(problem, cuts)
    problem.digests[shape] = (cuts, (problem.ops, problem.edges, segments))
    return segments


def _patched(problem: Problem, ops, edges, segments) -> tuple[Segment, ...]:
    """``segments`` (cut from the first copy, whose tables and edges were ``ops`` and ``edges``)
    with the hash of each segment that holds a replaced table, or an edge's replaced end,
    computed again under ``problem``."""
    changed = {i for i, (a, b) in enumerate(zip(problem.ops, ops)) if a is not b}
    for e, before in zip(problem.edges, edges):
        if e is not before:
            changed.update((e.src, e.dst))
    if not changed:
        return segments
    by_dst = edges_by_dst(problem)
    return tuple(
        replace(seg, key=content_key(problem, seg.ops, seg.exit_tensor, seg.exit_producer, by_dst))
        if changed.intersection(seg.ops)
        else seg
        for seg in segments
    )


def _segments(problem: Problem, cuts: list) -> tuple[Segment, ...]:
    bounds = [-1] + [i for i, _ in cuts] + [len(problem.ops) - 1]
    tensors = [None] + [t for _, t in cuts] + [None]
    producer = {o.tensor: i for i, t in enumerate(problem.ops) for o in t.op.outputs}
    by_dst = edges_by_dst(problem)
    segments = []
    for k in range(len(bounds) - 1):
        ops = tuple(range(bounds[k] + 1, bounds[k + 1] + 1))
        exit_tensor = tensors[k + 1]
        exit_producer = producer[exit_tensor] if exit_tensor else None
        layers = {problem.ops[op].op.layer for op in ops}
        segments.append(
            Segment(
                ops,
                tensors[k],
                exit_tensor,
                exit_producer,
                content_key(problem, ops, exit_tensor, exit_producer, by_dst),
                layers.pop() if len(layers) == 1 else None,
            )
        )
    return tuple(segments)


def segment_keys(problem: Problem, segments: Sequence[Segment]) -> tuple[str, ...]:
    """The content hash of each of ``segments`` (cut from a problem of the same graph) under
    ``problem``'s own costs: a variant of a problem (other recompute / ZeRO settings) may tell
    apart segments whose costs are equal in the problem (a ZeRO-3 gather of ln1 and of ln2)."""
    by_dst = edges_by_dst(problem)
    return tuple(
        content_key(problem, s.ops, s.exit_tensor, s.exit_producer, by_dst) for s in segments
    )


def segment_network(
    problem: Problem, seg: Segment, unary: Sequence[np.ndarray]
) -> tuple[Network, int | None, int | None]:
    """The pairwise network of a segment: op variables, then the entry and exit layout variables."""
    local = {op: n for n, op in enumerate(seg.ops)}
    n = len(seg.ops)
    entry_var = n if seg.entry_tensor else None
    exit_var = n + (1 if seg.entry_tensor else 0) if seg.exit_tensor else None
    sizes = [np.asarray(unary[op], dtype=np.float64) for op in seg.ops]
    if entry_var is not None:
        sizes.append(np.zeros(problem.producer_layout_count(seg.entry_tensor)))
    if exit_var is not None:
        sizes.append(np.zeros(problem.producer_layout_count(seg.exit_tensor)))
    net = Network(sizes)
    for e in problem.edges:
        if e.dst not in local:
            continue
        if e.src in local:
            net.add_factor(
                local[e.src], local[e.dst], _float(e.cost[np.ix_(e.src_index, e.dst_index)])
            )
        else:
            net.add_factor(entry_var, local[e.dst], _float(e.cost[:, e.dst_index]))
    if exit_var is not None:
        index = problem.producer_layout_index(seg.exit_tensor)
        gate = np.where(index[:, None] == np.arange(len(net.unary[exit_var]))[None, :], 0.0, np.inf)
        net.add_factor(local[seg.exit_producer], exit_var, gate)
    return net, entry_var, exit_var


def _float(matrix: np.ndarray) -> np.ndarray:
    return np.asarray(matrix, dtype=np.float64)


@dataclass(frozen=True, slots=True, eq=False)
class Power:
    """``table = base^r`` by repeated squaring, with the argmin midpoints of every product."""

    table: np.ndarray
    parts: tuple  # (kind, ...) tree for reconstruction

    def boundaries(self, i: int, j: int) -> list[int]:
        """The states at the r+1 boundaries of the run, from i to j."""
        return _walk(self.parts, i, j)


def _walk(node: tuple, i: int, j: int) -> list[int]:
    if node[0] == "leaf":
        return [i, j]
    _, left, right, arg = node
    k = int(arg[i, j])
    return _walk(left, i, k)[:-1] + _walk(right, k, j)


def matrix_power(base: np.ndarray, r: int) -> Power:
    """``base^r`` in the (min,+) semiring with O(log r) products."""
    square: tuple = ("leaf",)
    square_table = base
    result: tuple | None = None
    result_table = None
    while True:
        if r & 1:
            if result is None:
                result, result_table = square, square_table
            else:
                result_table, arg = minplus(result_table, square_table)
                result = ("product", result, square, arg)
        r >>= 1
        if not r:
            return Power(result_table, result)
        square_table, arg = minplus(square_table, square_table)
        square = ("product", square, square, arg)


def chain(tables: Sequence[np.ndarray]) -> tuple[float, list[int]]:
    """Left fold of a chain of tables (first has one row, last one column): value and boundary
    states."""
    vector = tables[0][0]
    args = []
    for t in tables[1:]:
        value, arg = minplus(vector[None, :], t)
        vector = value[0]
        args.append(arg[0])
    states = [0]
    for arg in reversed(args):
        states.append(int(arg[states[-1]]))
    states.reverse()  # states[k] = exit state of table k (the last is the single final column 0)
    return float(vector[0]), [0] + states


def tree_product(tables: Sequence[np.ndarray]) -> np.ndarray:
    """The same chain multiplied in a balanced bracketing (associativity check)."""
    items = list(tables)
    while len(items) > 1:
        items = [
            minplus(items[k], items[k + 1])[0] if k + 1 < len(items) else items[k]
            for k in range(0, len(items), 2)
        ]
    return items[0]


# ---------------------------------------------------------------- blocks: how segments are
# multiplied


@dataclass(frozen=True, slots=True, eq=False)
class Block:
    """A product of segment tables with the argmins needed to recover its inner boundaries.

    kind ``segment``: one table. ``product``: children multiplied left to right.
    ``power``: one child raised to ``count`` by repeated squaring.
    """

    kind: str
    table: np.ndarray
    children: tuple = ()
    args: tuple = ()
    power: Power | None = None
    count: int = 1

    def boundaries(self, i: int, j: int) -> list[int]:
        """States at every segment boundary inside the block, from entry state i to exit state j."""
        if self.kind == "segment":
            return [i, j]
        if self.kind == "power":
            outer = self.power.boundaries(i, j)
            child = self.children[0]
            states = [i]
            for a, b in zip(outer, outer[1:]):
                states += child.boundaries(a, b)[1:]
            return states
        mids = [j]
        for arg in reversed(self.args):
            mids.append(int(arg[i, mids[-1]]))
        mids.append(i)
        mids.reverse()  # [i, m1, ..., j] with one state per child boundary
        states = [i]
        for child, a, b in zip(self.children, mids, mids[1:]):
            states += child.boundaries(a, b)[1:]
        return states


def product_block(children: Sequence[Block]) -> Block:
    if len(children) == 1:
        return children[0]
    table = children[0].table
    args = []
    for child in children[1:]:
        table, arg = minplus(table, child.table)
        args.append(arg)
    return Block("product", table, tuple(children), tuple(args))


def group_blocks(segments: Sequence[Segment], tables: Sequence[np.ndarray]) -> list[Block]:
    """Segments of one layer become a layer block; runs of identical layers become powers."""
    units: list[tuple[tuple, Block]] = []
    layer_blocks: dict[tuple, Block] = {}  # equal keys, equal tables: one product per layer kind
    k = 0
    while k < len(segments):
        layer = segments[k].layer
        end = k + 1
        while layer is not None and end < len(segments) and segments[end].layer == layer:
            end += 1
        key = (
            tuple(segments[m].key for m in range(k, end))
            if layer is not None
            else (segments[k].key, k)
        )
        if key not in layer_blocks:
            layer_blocks[key] = product_block([Block("segment", tables[m]) for m in range(k, end)])
        units.append((key, layer_blocks[key]))
        k = end
    blocks: list[Block] = []
    k = 0
    while k < len(units):
        end = k + 1
        while end < len(units) and units[end][0] == units[k][0]:
            end += 1
        count = end - k
        if count > 1:
            power = matrix_power(units[k][1].table, count)
            blocks.append(Block("power", power.table, (units[k][1],), power=power, count=count))
        else:
            blocks.append(units[k][1])
        k = end
    return blocks
