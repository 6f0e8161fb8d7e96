"""SAPP's strategy generation for the eliminated operators (MindSpore's ``GenerateStrategyV3``).

With ``min_devices`` = D, D/2, ..., 2: a forward pass gives each operator without a split the split
of its first input's producer (not through a gather), a backward pass that of its first consumer's
input, repeated until nothing changes; a split is taken only when it spans at least ``min_devices``
devices. Operators still without one are replicated; the readers of one parameter split it as its
first reader does; the inputs (the virtual dataset, full batch) give no split.
"""

from __future__ import annotations

from planner.ir.graph import Operator
from planner.ir.ops import REGISTRY
from planner.search.sapp_graph import (
    NO_SPLIT_NORM_KINDS,
    WEIGHT_ORDER_ABOVE,
    Levels,
    RecGraph,
    first_even,
)


class Propagation:
    """``GenerateStrategyV3``: eliminated operators copy a neighbour's split, level by level."""

    def __init__(self, rec: RecGraph, cuts: list[list[str | None]], levels: int) -> None:
        graph = rec.graph
        self.graph, self.levels = graph, levels
        self.levels_of: list[Levels | None] = [None] * len(graph.operators)
        self.position = {op.name: i for i, op in enumerate(graph.operators)}
        for name, n in rec.index.items():
            self.levels_of[self.position[name]] = tuple(cuts[n])
        # ExtraShardMatmulOnBatchDim: above 32 devices a MatMul's K-split partial sums are
        # reduce-scattered over its rows, so consumers see the rows split on those levels too
        self.rows_for_k = {
            self.position[name]: (rec.nodes[n].families[2], rec.nodes[n].families[0][0])
            for name, n in rec.index.items()
            if rec.nodes[n].role == "matmul"
            and rec.nodes[n].families[0]
            and 2**levels > WEIGHT_ORDER_ABOVE
        }
        self.consumers: dict[str, list[int]] = {}
        for o, op in enumerate(graph.operators):
            for operand in op.inputs:
                self.consumers.setdefault(operand.tensor, []).append(o)

    def run(self) -> list[Levels]:
        devices = 2**self.levels
        while devices > 1:
            while self._pass(devices, forward=True) or self._pass(devices, forward=False):
                pass
            devices //= 2
        none = (None,) * self.levels
        out = [levels if levels is not None else none for levels in self.levels_of]
        return self._align_shared_params(out)

    def _pass(self, min_devices: int, forward: bool) -> int:
        changes = 0
        order = (
            range(len(self.graph.operators))
            if forward
            else reversed(range(len(self.graph.operators)))
        )
        for o in order:
            if self.levels_of[o] is None:
                found = self._from_producer(o) if forward else self._from_consumer(o)
                if found is not None and 2 ** sum(d is not None for d in found) >= min_devices:
                    self.levels_of[o] = found
                    changes += 1
        return changes

    def _from_producer(self, o: int) -> Levels | None:
        op = self.graph.operators[o]
        for operand in op.inputs:  # the first input whose producer has a split
            source = self._split_of(operand.tensor)
            if source == ():
                return None
            if source is not None:
                return _follow(op, operand.dims, source)
        return None

    def _split_of(self, tensor: str):
        """The per-level halved tensor dim of a tensor's producer: None while unknown or for inputs
        (the virtual dataset keeps the full batch whole), () when a gather produced it (SAPP stops
        there)."""
        name = self.graph.producer(tensor)
        if name is None:
            return None
        producer = self.graph.operators[self.position[name]]
        levels = self.levels_of[self.position[name]]
        if levels is None:
            return None
        if REGISTRY[producer.kind].category == "gather":
            return ()
        groups = next(o.dims for o in producer.outputs if o.tensor == tensor)
        if self.position[name] in self.rows_for_k:
            k_dims, row = self.rows_for_k[self.position[name]]
            levels = tuple(row if d in k_dims else d for d in levels)
        return tuple(_tensor_dim(groups, d) for d in levels)

    def _from_consumer(self, o: int) -> Levels | None:
        op = self.graph.operators[o]
        for out in op.outputs:
            for c in self.consumers.get(out.tensor, ()):
                levels = self.levels_of[c]
                if levels is not None:
                    groups = next(
                        i.dims for i in self.graph.operators[c].inputs if i.tensor == out.tensor
                    )
                    return _follow(op, out.dims, tuple(_tensor_dim(groups, d) for d in levels))
        return None

    def _align_shared_params(self, out: list[Levels]) -> list[Levels]:
        """``ModifyParamSharingOpsStrategy``: every reader of a parameter splits it as its first
        reader."""
        readers: dict[str, list[int]] = {}
        for o, op in enumerate(self.graph.operators):
            for operand in op.inputs:
                if self.graph.tensor(operand.tensor).role == "param":
                    readers.setdefault(operand.tensor, []).append(o)
        for tensor, ops in readers.items():
            first = next(i.dims for i in self.graph.operators[ops[0]].inputs if i.tensor == tensor)
            wanted = tuple(_tensor_dim(first, d) for d in out[ops[0]])
            for o in ops[1:]:
                op = self.graph.operators[o]
                groups = next(i.dims for i in op.inputs if i.tensor == tensor)
                mine = tuple(_tensor_dim(groups, d) for d in out[o])
                if mine != wanted:
                    aligned = _follow(op, groups, wanted)
                    own = {d for g in groups for d in g}
                    out[o] = tuple(
                        a if w is not None or d in own else d
                        for a, w, d in zip(aligned, wanted, out[o])
                    )
        return out


def _tensor_dim(groups, dim: str | None) -> int | None:
    return next((t for t, g in enumerate(groups) if dim in g), None) if dim is not None else None


def _follow(op: Operator, groups, split: tuple[int | None, ...]) -> Levels:
    """An operator's per-level dims that halve, level by level, the tensor dims ``split`` names on
    one of its operands: the first dim of that group the operator may split with an even extent."""
    local = dict(op.sizes)
    inner = {d for o in op.inputs + op.outputs for g in o.dims for d in g[1:]}
    whole = set(op.unsplittable) | inner
    if op.kind in NO_SPLIT_NORM_KINDS:
        whole |= set(op.norm_dims)
    out: list[str | None] = []
    for t in split:
        dim = None
        if t is not None and t < len(groups):
            dim = first_even(groups[t], local, whole)
        if dim is not None:
            local[dim] //= 2
        out.append(dim)
    return tuple(out)
