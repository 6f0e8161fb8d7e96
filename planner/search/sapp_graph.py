"""SAPP's reduced graph: the searched operators of a graph and the edges left once the others are
eliminated.

MindSpore's ``rec_parse_graph`` keeps MatMul, Conv, pooling and the batch-parallel types (plus a
virtual dataset node per data input) and eliminates every other operator: a producer is rewired to
the consumers of the eliminated operator, its input 0 as the main edge and its other inputs as
auxiliary edges. The transposes and reshapes on an eliminated path are kept as a shape map, so a
neighbour is "adjacent" (its redistribution counts) only when the shapes agree through them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.ir.graph import Graph, Operator
from planner.ir.ops import REGISTRY

MEM_COEF = 0.1  # rp_matmul_mem_coef
REDIS_COEF = 16
REPLICATE_BELOW = 25
EXPERT_COEF = 0.15  # BatchMatMul: scales the least of its operands' halves
CORES = 32  # NUMBER_ASCEND_CORES, in the BatchMatMul batch-cut ratio
WEIGHT_ORDER_ABOVE = 32  # devices; SAPP orders by weight above this (micro-batch < 8)
BATCH_PARALLEL_KINDS = ("batchnorm", "cross_entropy")
POOL_KINDS = ("maxpool", "avgpool")
# their normalised dims stay whole
NO_SPLIT_NORM_KINDS = ("softmax", "layernorm", "rmsnorm", "cross_entropy")
Levels = tuple[str | None, ...]


@dataclass(slots=True)
class _Node:
    """A searched node: a graph operator, or the virtual dataset of a data tensor (``op`` None)."""

    name: str
    role: str  # matmul | bmm | conv | pool | batch | virtual
    sizes: dict[str, int]
    inputs: tuple[tuple[tuple[str, ...], ...], ...]  # per input: groups of dims per tensor dim
    output: tuple[tuple[str, ...], ...]
    # MatMul: (i, j, k) dims; BatchMatMul: (i, j, k, b, x)
    families: tuple[tuple[str, ...], ...] = ()
    op: Operator | None = None
    # dims the planner never splits (unsplittable, inner of a merged group)
    whole: frozenset[str] = frozenset()


def _role(op: Operator) -> str | None:
    kind = REGISTRY[op.kind]
    if op.kind == "conv2d":
        return "conv"
    if op.kind in POOL_KINDS:
        return "pool"
    if op.kind in BATCH_PARALLEL_KINDS:
        return "batch"
    if op.kind == "attention":  # FlashAttentionScore: always eliminated in SAPP
        return None
    if kind.category == "contraction" and len(op.inputs) >= 2 and len(op.outputs) == 1:
        a, b, c = (set(o.op_dims()) for o in (op.inputs[0], op.inputs[1], op.outputs[0]))
        if (a - b) and (b - a):
            return "bmm" if a & b & c else "matmul"
    return None


def _families(op: Operator) -> tuple[tuple[str, ...], ...]:
    """(i, j, k) of C[i,j] = A[i,k] B[k,j]; a BatchMatMul adds its batch dims at A's 4-D n and c."""
    a, b = list(op.inputs[0].op_dims()), list(op.inputs[1].op_dims())
    c = set(op.outputs[0].op_dims())
    families = (
        tuple(d for d in a if d not in b and d in c),
        tuple(d for d in b if d not in a and d in c),
        tuple(d for d in a if d in b and d not in c),
    )
    batch = [d for d in a if d in b and d in c]
    if not batch:
        return families
    groups = op.inputs[0].dims
    return families + tuple(
        tuple(d for d in batch if position4d(groups, d) == pos) for pos in (0, 1)
    )


def _op_node(op: Operator, role: str) -> _Node:
    inner = {d for o in op.inputs + op.outputs for g in o.dims for d in g[1:]}
    return _Node(
        op.name,
        role,
        dict(op.sizes),
        tuple(o.dims for o in op.inputs),
        op.outputs[0].dims,
        _families(op) if role in ("matmul", "bmm") else (),
        op,
        frozenset(op.unsplittable) | frozenset(inner),
    )


def _virtual_node(name: str, shape: tuple[int, ...]) -> _Node:
    dims = tuple((f"#{i}",) for i in range(len(shape)))
    return _Node(
        f"_VirtualDataset[{name}]",
        "virtual",
        {f"#{i}": s for i, s in enumerate(shape)},
        (dims,),
        dims,
    )


def first_even(dims, local: dict[str, int], whole=frozenset()) -> str | None:
    """The first of ``dims`` that may be halved: not ``whole``, its local extent even."""
    return next((d for d in dims if d not in whole and local[d] >= 2 and local[d] % 2 == 0), None)


def groups_shape(groups, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(math.prod(sizes[d] for d in g) for g in groups)


def position4d(groups, dim: str | None) -> int:
    """The 4-D position (right-aligned) of the tensor dim that ``dim`` halves, -1 when none."""
    for t, group in enumerate(groups):
        if dim in group:
            return t + 4 - len(groups)
    return -1


def bits(mask: int):
    """The set bits of a mask, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


# (node, producer shape mapped along the eliminated path)
Source = tuple[int, tuple[int, ...] | None]


class RecGraph:
    """The searched nodes of a graph with the main and auxiliary edges of the eliminated paths.

    Auxiliary sources accumulate along eliminated chains (a residual stream carries every earlier
    branch), so they are kept as bitmasks over nodes, one per mapped shape: merging and counting
    them are word operations, which keeps the search linear in practice.
    ``sources[n][slot]`` = (main source or None, whether it is adjacent, adjacent auxiliary mask);
    ``consumers[n]`` = {number of the consumer's arguments with the mapped shape: consumer mask}.
    """

    def __init__(
        self, graph: Graph, with_consumers: bool = True, search_batch_matmul: bool = False
    ) -> None:
        self.nodes: list[_Node] = []
        self.index: dict[str, int] = {}  # graph op name -> node
        self.virtual: dict[str, int] = {}  # data tensor -> node
        self.graph = graph
        for op in graph.operators:
            role = _role(op)
            if role == "bmm" and not search_batch_matmul:
                # MindSpore 2.10 eliminates BatchMatMul (it is searched only with dynamic shapes)
                role = None
            if role is not None:
                self.index[op.name] = len(self.nodes)
                self.nodes.append(_op_node(op, role))
        self._traced: dict[str, tuple[Source | None, dict]] = {}
        raw: dict[int, list[tuple[Source | None, dict]]] = {}
        for op in graph.operators:  # topological: every input is traced before it is read
            if op.name in self.index:
                n = self.index[op.name]
                raw[n] = [self._trace(operand.tensor) for operand in op.inputs]
                self._traced[op.outputs[0].tensor] = (
                    (n, self.graph.tensor(op.outputs[0].tensor).shape),
                    {},
                )
            else:
                traced = self._eliminate(op)
                for out in op.outputs:
                    self._traced[out.tensor] = traced
        self.sources: list[list[tuple[int | None, bool, int]]] = [[] for _ in self.nodes]
        self.consumers: list[dict[int, int]] = [{} for _ in self.nodes]
        for n in sorted(raw):
            self._connect(n, raw[n], with_consumers)

    def _connect(self, n: int, traced: list, with_consumers: bool) -> None:
        """One node's sources per input slot (an auxiliary source that is also a main one, or that
        an earlier slot has, is dropped) and, if asked, its entry in each source's consumers."""
        node = self.nodes[n]
        shapes = [groups_shape(g, node.sizes) for g in node.inputs]
        mains = 0
        for main, _ in traced:
            mains |= (1 << main[0]) if main else 0
        seen, linked = mains | (1 << n), 1 << n
        for slot, (main, aux) in enumerate(traced):
            adjacent = 0
            for shape, mask in aux.items():
                adjacent |= mask & ~seen if shape == shapes[slot] else 0
            own = main[0] if main is not None and main[0] != n else None
            self.sources[n].append((own, own is not None and main[1] == shapes[slot], adjacent))
            if with_consumers:
                if own is not None and not linked >> own & 1:
                    linked |= 1 << own
                    self._add_consumers(1 << own, n, main[1], shapes)
                for shape, mask in aux.items():
                    self._add_consumers(mask & ~seen & ~linked, n, shape, shapes)
                    linked |= mask & ~seen
            for mask in aux.values():
                seen |= mask

    def _add_consumers(self, mask: int, dst: int, shape, shapes) -> None:
        same = sum(1 for s in shapes if s == shape) if shape is not None else 0
        if same and mask:
            for src in bits(mask):
                table = self.consumers[src]
                table[same] = table.get(same, 0) | (1 << dst)

    def _trace(self, tensor: str) -> tuple[Source | None, dict]:
        """(main, aux) sources of a tensor; aux is {mapped shape: node mask}."""
        if tensor not in self._traced:
            t = self.graph.tensor(tensor)
            if t.role != "data":
                return None, {}
            self.virtual[tensor] = len(self.nodes)
            self.nodes.append(_virtual_node(tensor, t.shape))
            self._traced[tensor] = ((self.virtual[tensor], t.shape), {})
        return self._traced[tensor]

    def _eliminate(self, op: Operator) -> tuple[Source | None, dict]:
        """Input 0 stays the main source; the other inputs' sources join the auxiliary ones."""
        main, aux = self._trace(op.inputs[0].tensor)
        merged = dict(aux)
        for operand in op.inputs[1:]:
            other_main, other_aux = self._trace(operand.tensor)
            if other_main is not None:
                merged[other_main[1]] = merged.get(other_main[1], 0) | (1 << other_main[0])
            for shape, mask in other_aux.items():
                merged[shape] = merged.get(shape, 0) | mask
        out: dict = {}
        for shape, mask in merged.items():
            mapped = _mapped(op, (0, shape))[1]
            out[mapped] = out.get(mapped, 0) | mask
        return _mapped(op, main), out


def _mapped(op: Operator, source):
    """A source's shape seen after ``op``: transposes permute it, reshapes replace it, others keep
    it."""
    if source is None:
        return None
    node, shape = source
    if shape is None:
        return source
    in_groups, out_groups = op.inputs[0].dims, op.outputs[0].dims
    if op.kind == "transpose":
        order = [next(t for t, g in enumerate(in_groups) if group[0] in g) for group in out_groups]
        return node, tuple(shape[t] for t in order)
    if op.kind == "reshape":
        sizes = op.sizes
        return node, (
            groups_shape(out_groups, sizes) if shape == groups_shape(in_groups, sizes) else None
        )
    return source
