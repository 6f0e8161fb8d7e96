"""The intermediate representation: tensors, operators in einsum form, and the validated graph.

An operator iterates over named *dims* (einsum indices) with sizes. Each operand (input or
output) lists, per tensor dimension, the group of op dims that make it up: ``("b",)`` for a
plain dimension, ``("a", "d")`` for a tensor dimension that is the row-major merge of two op
dims (how views such as reshape are written). Only the leading dim of a group may be split
by a mesh axis, so that a split always maps to a contiguous ``Shard`` of the tensor dimension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import networkx as nx

from planner.errors import GraphError

TENSOR_ROLES = ("activation", "param", "data")


def _check_name(value: object, where: str) -> None:
    if not isinstance(value, str) or not value:
        raise GraphError(f"{where}: name must be a non-empty string, got {value!r}")


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor of the graph. ``role`` is activation (produced by an op), param or data."""

    name: str
    shape: tuple[int, ...]
    role: str = "activation"
    integer: bool = False
    checkpoint: bool = False

    def __post_init__(self) -> None:
        _check_name(self.name, "tensor")
        if self.role not in TENSOR_ROLES:
            raise GraphError(
                f"tensor {self.name}: field 'role' must be one of {TENSOR_ROLES}, got {self.role!r}"
            )
        for size in self.shape:
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise GraphError(
                    f"tensor {self.name}: field 'shape' needs positive integers, got {self.shape!r}"
                )

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def differentiable(self) -> bool:
        """Whether the tensor can carry a gradient (a float param or activation); which ones do is
        ``Graph.grad_tensors``."""
        return self.role != "data" and not self.integer


@dataclass(frozen=True, slots=True)
class Operand:
    """One input or output of an operator: the tensor and its dims as groups of op dims."""

    tensor: str
    dims: tuple[tuple[str, ...], ...]
    saved: bool = False

    def op_dims(self) -> Iterator[str]:
        for group in self.dims:
            yield from group


@dataclass(frozen=True, slots=True)
class Operator:
    """An operator in einsum form.

    ``dims`` are the iteration dims with sizes, in declaration order. ``unsplittable`` dims can
    never be split; splitting a ``norm_dims`` dim costs an all-reduce of ``norm_stats`` values per
    element of the non-normalised dims (forward and backward). ``flops`` is the forward count.
    """

    name: str
    kind: str
    dims: tuple[tuple[str, int], ...]
    inputs: tuple[Operand, ...]
    outputs: tuple[Operand, ...]
    flops: int
    backward_factor: float = 1.0
    unsplittable: frozenset[str] = frozenset()
    norm_dims: frozenset[str] = frozenset()
    norm_stats: int = 0
    layer: int | None = None
    # numeric details that do not change costs (pool kernel, ...)
    attrs: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        _check_name(self.name, "operator")
        for key, value in self.attrs:
            if (
                not isinstance(key, str)
                or isinstance(value, bool)
                or not isinstance(value, int)
                or value < 0
            ):
                raise GraphError(
                    f"operator {self.name}: field 'attrs' needs non-negative integers, got "
                    f"{key!r}: {value!r}"
                )
        names = [d for d, _ in self.dims]
        if len(set(names)) != len(names):
            raise GraphError(f"operator {self.name}: field 'dims' repeats a dim: {names}")
        for dim, size in self.dims:
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise GraphError(
                    f"operator {self.name}: field 'dims' needs a positive integer size for "
                    f"{dim!r}, got {size!r}"
                )
        declared = set(names)
        for field_name, operands in (("inputs", self.inputs), ("outputs", self.outputs)):
            for operand in operands:
                unknown = [d for d in operand.op_dims() if d not in declared]
                if unknown:
                    raise GraphError(
                        f"operator {self.name}: field '{field_name}' uses undeclared dims "
                        f"{unknown} for {operand.tensor}"
                    )
        if not self.outputs:
            raise GraphError(f"operator {self.name}: field 'outputs' is empty")
        if self.flops < 0:
            raise GraphError(f"operator {self.name}: field 'flops' is negative")
        for set_name, label in (("unsplittable", "unsplittable"), ("norm_dims", "norm")):
            extra = set(getattr(self, set_name)) - declared
            if extra:
                raise GraphError(
                    f"operator {self.name}: field '{label}' names undeclared dims {sorted(extra)}"
                )

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.dims)

    def attr(self, key: str, default: int) -> int:
        return dict(self.attrs).get(key, default)

    def operand_shape(self, operand: Operand) -> tuple[int, ...]:
        sizes = self.sizes
        return tuple(math.prod(sizes[d] for d in group) for group in operand.dims)


DIM_NAMES = ("semantic", "positional")


@dataclass(frozen=True, slots=True)
class Graph:
    """A validated DAG of operators. Operators are kept in a topological order.

    ``batch_dim`` names the op dim that counts samples (``b`` in the zoo and the torch importer):
    data parallelism splits it, and ``batch_size`` (its size, which every operator that has it
    must agree on) is the global batch that micro-batching and gradient accumulation divide.
    ``dim_names`` says what the other letters mean: ``semantic`` (the zoo: ``a`` heads, ``f`` ffn,
    ``v`` vocabulary, ``e`` experts, which the Megatron baseline reads) or ``positional``
    (import-torch:
    letters by position in each operator, so baselines follow the data flow instead)."""

    name: str
    tensors: tuple[Tensor, ...]
    operators: tuple[Operator, ...]
    batch_dim: str = "b"
    dim_names: str = "semantic"
    _index: dict = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        _check_name(self.name, "graph")
        tensors = {}
        for t in self.tensors:
            if t.name in tensors:
                raise GraphError(f"tensor {t.name}: field 'name' is not unique")
            tensors[t.name] = t
        producer: dict[str, str] = {}
        seen_ops: set[str] = set()
        for op in self.operators:
            if op.name in seen_ops:
                raise GraphError(f"operator {op.name}: field 'name' is not unique")
            seen_ops.add(op.name)
            self._check_operands(op, tensors)
            for out in op.outputs:
                if out.tensor in producer:
                    raise GraphError(
                        f"operator {op.name}: field 'outputs' writes {out.tensor}, already written "
                        f"by {producer[out.tensor]}"
                    )
                if tensors[out.tensor].role != "activation":
                    raise GraphError(
                        f"operator {op.name}: field 'outputs' writes {tensors[out.tensor].role} "
                        f"tensor {out.tensor}"
                    )
                producer[out.tensor] = op.name
        for t in self.tensors:
            if t.role == "activation" and t.name not in producer:
                raise GraphError(
                    f"tensor {t.name}: field 'role' is activation but no operator produces it"
                )
        _check_name(self.batch_dim, f"graph {self.name}: field 'batch_dim'")
        if self.dim_names not in DIM_NAMES:
            raise GraphError(
                f"graph {self.name}: field 'dim_names' {self.dim_names!r} is not one of "
                f"{', '.join(DIM_NAMES)}"
            )
        order = self._topological_order(producer)
        object.__setattr__(self, "operators", order)
        object.__setattr__(self, "_index", {"tensors": tensors, "producer": producer})

    @property
    def batch_size(self) -> int:
        """The size of the batch dim: the global batch of one training step."""
        sizes = sorted(
            {op.sizes[self.batch_dim] for op in self.operators if self.batch_dim in op.sizes}
        )
        if len(sizes) != 1:
            why = f"has different sizes {sizes}" if sizes else "is in no operator"
            raise GraphError(f"graph {self.name}: field 'batch_dim' {self.batch_dim!r} {why}")
        return sizes[0]

    @staticmethod
    def _check_operands(op: Operator, tensors: dict[str, Tensor]) -> None:
        for field_name, operands in (("inputs", op.inputs), ("outputs", op.outputs)):
            for operand in operands:
                if operand.tensor not in tensors:
                    raise GraphError(
                        f"operator {op.name}: field '{field_name}' names unknown tensor "
                        f"{operand.tensor!r}"
                    )
                want = tensors[operand.tensor].shape
                got = op.operand_shape(operand)
                if got != want:
                    raise GraphError(
                        f"operator {op.name}: field '{field_name}' sees {operand.tensor} with "
                        f"shape {got}, tensor has {want}"
                    )

    def _topological_order(self, producer: dict[str, str]) -> tuple[Operator, ...]:
        g = nx.DiGraph()
        by_name = {op.name: op for op in self.operators}
        position = {op.name: i for i, op in enumerate(self.operators)}
        g.add_nodes_from(by_name)
        for op in self.operators:
            for operand in op.inputs:
                if operand.tensor in producer:
                    g.add_edge(producer[operand.tensor], op.name)
        try:
            names = list(nx.lexicographical_topological_sort(g, key=position.__getitem__))
        except nx.NetworkXUnfeasible:
            cycle = [u for u, _ in nx.find_cycle(g)]
            raise GraphError(
                f"operator {cycle[0]}: field 'inputs' closes a cycle through {' -> '.join(cycle)}"
            ) from None
        return tuple(by_name[n] for n in names)

    def tensor(self, name: str) -> Tensor:
        return self._index["tensors"][name]

    def producer(self, tensor: str) -> str | None:
        return self._index["producer"].get(tensor)

    def derived(self, key: tuple, build: Callable[[], object]) -> object:
        """A fact computed from this (immutable) graph, built once per key: the cost model's
        operand facts per training settings, asked for each micro-batch count and variant."""
        if key not in self._index:
            self._index[key] = build()
        return self._index[key]

    def grad_tensors(self) -> frozenset[str]:
        """Tensors whose gradient a training step computes: float parameters, and activations
        computed from one (autograd's requires_grad; a gradient nothing upstream uses is skipped).
        The one definition the cost model, the executor and the exports share."""
        if "grads" not in self._index:
            out = {t.name for t in self.tensors if t.role == "param" and t.differentiable}
            for op in self.operators:
                if any(o.tensor in out for o in op.inputs):
                    out.update(o.tensor for o in op.outputs if self.tensor(o.tensor).differentiable)
            self._index["grads"] = frozenset(out)
        return self._index["grads"]

    def operator(self, name: str) -> Operator:
        for op in self.operators:
            if op.name == name:
                return op
        raise KeyError(name)

    @property
    def params(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors if t.role == "param")

    @property
    def num_params(self) -> int:
        return sum(t.numel for t in self.params)

    @property
    def flops(self) -> int:
        return sum(op.flops for op in self.operators)

    def to_networkx(self) -> nx.MultiDiGraph:
        """Operators as nodes, one edge per (producer, consumer, tensor)."""
        g = nx.MultiDiGraph()
        for op in self.operators:
            g.add_node(op.name, kind=op.kind, layer=op.layer)
        for op in self.operators:
            for slot, operand in enumerate(op.inputs):
                src = self.producer(operand.tensor)
                if src is not None:
                    g.add_edge(src, op.name, tensor=operand.tensor, slot=slot)
        return g
