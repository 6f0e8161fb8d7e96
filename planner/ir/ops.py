"""The operator registry (every operator declared once, in einsum form) and a graph builder.

An equation lists operand dims with one letter per op dim; parentheses merge op dims into one
tensor dimension (row-major), which is how views are written: ``"bs(ad)->bsad"`` is a reshape
that splits the hidden dim into heads. Dims that appear in inputs but not in the output are the
reduction dims: splitting one leaves the output ``Partial``.
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from planner.errors import GraphError
from planner.ir.graph import Graph, Operand, Operator, Tensor

Groups = tuple[tuple[str, ...], ...]


def parse_operand(text: str) -> Groups:
    """Parse ``"bs(ad)"`` into ``(("b",), ("s",), ("a", "d"))``."""
    groups: list[tuple[str, ...]] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "(":
            end = text.find(")", i)
            if end < 0 or end == i + 1:
                raise GraphError(f"field 'equation' has an unbalanced group in {text!r}")
            group = tuple(text[i + 1 : end])
            if not all(c.isascii() and c.isalpha() for c in group):
                raise GraphError(f"field 'equation' needs ASCII letters in a group, got {text!r}")
            groups.append(group)
            i = end + 1
        elif ch.isascii() and ch.isalpha():
            groups.append((ch,))
            i += 1
        else:
            raise GraphError(
                f"field 'equation' has bad character {ch!r} in {text!r} (ASCII letters only)"
            )
    flat = [d for g in groups for d in g]
    if len(set(flat)) != len(flat):
        raise GraphError(
            f"field 'equation' repeats an index within {text!r} (diagonals are not supported)"
        )
    return tuple(groups)


def parse_equation(equation: str, where: str) -> tuple[list[Groups], list[Groups]]:
    if not isinstance(equation, str) or "->" not in equation:
        raise GraphError(f"{where}: field 'equation' must look like 'bk,kn->bn', got {equation!r}")
    try:
        ins, outs = _parse_equation(equation)
    except GraphError as exc:  # raised without a place: say which operator
        raise GraphError(f"{where}: {exc}") from None
    return list(ins), list(outs)


# the layers of a model repeat a handful of equations thousands of times
@functools.lru_cache(maxsize=4096)
def _parse_equation(equation: str) -> tuple[tuple[Groups, ...], tuple[Groups, ...]]:
    lhs, rhs = equation.replace(" ", "").split("->", 1)
    ins = tuple(parse_operand(part) for part in lhs.split(",")) if lhs else ()
    return ins, tuple(parse_operand(part) for part in rhs.split(","))


def _all_dims(sizes: Mapping[str, int], ins: list[Groups], outs: list[Groups]) -> int:
    return math.prod(sizes.values())


def _output_points(sizes: Mapping[str, int], ins: list[Groups], outs: list[Groups]) -> int:
    return math.prod(sizes[d] for g in outs[0] for d in g)


def _input_points(sizes: Mapping[str, int], ins: list[Groups], outs: list[Groups]) -> int:
    return math.prod(sizes[d] for g in ins[0] for d in g)


def _conv_points(sizes: Mapping[str, int], ins: list[Groups], outs: list[Groups]) -> int:
    # Input spatial dims (H, W) are indexed through the output and kernel dims: not iterated.
    return math.prod(v for d, v in sizes.items() if d not in ("H", "W"))


def _zero(sizes: Mapping[str, int], ins: list[Groups], outs: list[Groups]) -> int:
    return 0


@dataclass(frozen=True, slots=True)
class OpKind:
    """How one operator kind is costed: FLOPs, backward factor, what it saves, default norms."""

    name: str
    category: str  # contraction | elementwise | norm | view | reduction | gather
    flops_per_point: int
    points: Callable[[Mapping[str, int], list[Groups], list[Groups]], int]
    backward_factor: float
    saves_inputs: bool
    norm_stats: int = 0
    spatial: str = ""  # dims that are never split (convolution / pooling windows)
    # bytes per element kept of a saved input (0: the tensor's own; dropout: a mask)
    saved_bytes: int = 0

    @property
    def light(self) -> bool:
        return self.category in ("elementwise", "norm", "view")


def _kinds(*kinds: OpKind) -> Mapping[str, OpKind]:
    return MappingProxyType({k.name: k for k in kinds})


POINTS = {
    "all": _all_dims,
    "output": _output_points,
    "input": _input_points,
    "conv": _conv_points,
    "none": _zero,
}
CATEGORIES = ("contraction", "elementwise", "norm", "view", "reduction", "gather")


def _row_kind(row: Mapping[str, str]) -> OpKind:
    if (
        row["category"] not in CATEGORIES
        or row["points"] not in POINTS
        or row["saves_inputs"] not in ("true", "false")
    ):
        raise ValueError(f"operator registry: row {row['kind']!r} is malformed")
    return OpKind(
        row["kind"],
        row["category"],
        int(row["flops_per_point"]),
        POINTS[row["points"]],
        float(row["backward_factor"]),
        row["saves_inputs"] == "true",
        int(row["norm_stats"]),
        row["spatial"],
        int(row["saved_bytes"]),
    )


def _load_registry() -> Mapping[str, OpKind]:
    text = (
        resources.files("planner.ir").joinpath("data", "operators.csv").read_text(encoding="utf-8")
    )
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return _kinds(*(_row_kind(row) for row in csv.DictReader(lines)))


REGISTRY: Mapping[str, OpKind] = _load_registry()  # planner/ir/data/operators.csv


# kinds whose several outputs the interpreter, executor and XLA check support
MULTI_OUTPUT = ("split",)


def op_kind(kind: str, where: str = "operator") -> OpKind:
    """Look up a kind, raising a ``GraphError`` that names the field when it is unknown."""
    try:
        return REGISTRY[kind]
    except KeyError:
        raise GraphError(
            f"{where}: field 'kind' is unknown operator {kind!r} (known: "
            f"{', '.join(sorted(REGISTRY))})"
        ) from None


def _check_operands(where: str, kind: str, ins, outs, inputs, outputs, saved) -> None:
    """The equation's operands against the tensors given, and the ``saved`` flags."""
    if len(ins) != len(inputs) or len(outs) != len(outputs):
        raise GraphError(
            f"{where}: field 'equation' has {len(ins)} inputs/{len(outs)} outputs, given "
            f"{len(inputs)}/{len(outputs)}"
        )
    if not inputs:
        raise GraphError(f"{where}: field 'inputs' is empty (every operator reads a tensor)")
    if len(outputs) > 1 and kind not in MULTI_OUTPUT:
        raise GraphError(
            f"{where}: field 'outputs' has {len(outputs)} tensors; only {', '.join(MULTI_OUTPUT)} "
            "may have several"
        )
    if saved is not None and len(saved) != len(inputs):
        raise GraphError(
            f"{where}: field 'saved' has {len(saved)} entries for {len(inputs)} inputs"
        )
    if saved is not None and not all(isinstance(s, bool) for s in saved):
        raise GraphError(
            f"{where}: field 'saved' must list true/false per input, got {list(saved)[:4]!r}"
        )


def make_operator(
    kind: str,
    name: str,
    equation: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    sizes: Mapping[str, int],
    *,
    norm: str = "",
    unsplittable: str = "",
    saved: Sequence[bool] | None = None,
    layer: int | None = None,
    attrs: Mapping[str, int] | None = None,
) -> Operator:
    """Build an ``Operator`` from its kind and equation; ``sizes`` gives every dim's size."""
    where = f"operator {name}"
    spec = op_kind(kind, where)
    ins, outs = parse_equation(equation, where)
    _check_operands(where, kind, ins, outs, inputs, outputs, saved)
    order: list[str] = []
    for groups in ins + outs:
        for group in groups:
            order.extend(d for d in group if d not in order)
    missing = [d for d in order if d not in sizes]
    if missing:
        raise GraphError(f"{where}: field 'sizes' lacks dims {missing}")
    dims = tuple((d, sizes[d]) for d in order)
    if kind == "opaque":  # an operator the planner cannot see into runs whole on every device
        unsplittable = "".join(order)
    saved = saved if saved is not None else [spec.saves_inputs] * len(inputs)
    flops = spec.flops_per_point * spec.points(dict(dims), ins, outs)
    return Operator(
        name=name,
        kind=kind,
        dims=dims,
        inputs=tuple(Operand(t, g, bool(s)) for t, g, s in zip(inputs, ins, saved)),
        outputs=tuple(Operand(t, g) for t, g in zip(outputs, outs)),
        flops=int(flops),
        backward_factor=spec.backward_factor,
        unsplittable=frozenset(unsplittable) | frozenset(d for d in spec.spatial if d in sizes),
        norm_dims=frozenset(norm),
        norm_stats=spec.norm_stats if norm else 0,
        layer=layer,
        attrs=tuple(sorted((attrs or {}).items())),
    )


class GraphBuilder:
    """Incremental construction of a ``Graph``; sizes of input dims are read off the tensors."""

    def __init__(self, name: str, batch_dim: str = "b", dim_names: str = "semantic") -> None:
        self.name = name
        self.batch_dim = batch_dim
        self.dim_names = dim_names
        self.layer: int | None = None
        self._tensors: dict[str, Tensor] = {}
        self._ops: list[Operator] = []

    def data(self, name: str, shape: Sequence[int], integer: bool = False) -> str:
        return self._add_tensor(Tensor(name, tuple(shape), "data", integer))

    def param(self, name: str, shape: Sequence[int]) -> str:
        return self._add_tensor(Tensor(name, tuple(shape), "param"))

    def checkpoint(self, name: str) -> str:
        """Mark an activation as kept under full recompute (a layer boundary)."""
        t = self._tensors[name]
        self._tensors[name] = Tensor(t.name, t.shape, t.role, t.integer, True)
        return name

    def _add_tensor(self, tensor: Tensor) -> str:
        if tensor.name in self._tensors:
            raise GraphError(f"tensor {tensor.name}: field 'name' is not unique")
        self._tensors[tensor.name] = tensor
        return tensor.name

    def shape(self, name: str) -> tuple[int, ...]:
        return self._tensors[name].shape

    def op(
        self,
        kind: str,
        name: str,
        equation: str,
        inputs: Sequence[str],
        *,
        sizes: Mapping[str, int] | None = None,
        out: str | Sequence[str] | None = None,
        norm: str = "",
        unsplittable: str = "",
        saved: Sequence[bool] | None = None,
        attrs: Mapping[str, int] | None = None,
    ) -> str:
        """Add an operator; returns its (first) output tensor name."""
        where = f"operator {name}"
        ins, outs = parse_equation(equation, where)
        known = self._sizes(where, ins, inputs, sizes)
        names = (
            [out]
            if isinstance(out, str)
            else list(out or [name if len(outs) == 1 else f"{name}.{i}" for i in range(len(outs))])
        )
        operator = make_operator(
            kind,
            name,
            equation,
            inputs,
            names,
            known,
            norm=norm,
            unsplittable=unsplittable,
            saved=saved,
            layer=self.layer,
            attrs=attrs,
        )
        for tensor, operand in zip(names, operator.outputs):
            self._add_tensor(Tensor(tensor, operator.operand_shape(operand)))
        self._ops.append(operator)
        return names[0]

    def _sizes(self, where: str, ins, inputs: Sequence[str], sizes) -> dict[str, int]:
        """Every dim's size: the given ones, and the rest from the input tensors' shapes (-1 where a
        merged dim does not divide)."""
        known = dict(sizes or {})
        for tensor, groups in zip(inputs, ins):
            if tensor not in self._tensors:
                raise GraphError(f"{where}: field 'inputs' names unknown tensor {tensor!r}")
            shape = self._tensors[tensor].shape
            if len(shape) != len(groups):
                raise GraphError(
                    f"{where}: field 'equation' gives {tensor} rank {len(groups)}, tensor has rank "
                    f"{len(shape)}"
                )
            for group, size in zip(groups, shape):
                free = [d for d in group if d not in known]
                if len(free) == 1:
                    rest = math.prod(known[d] for d in group if d in known)
                    known[free[0]] = size // rest if rest and size % rest == 0 else -1
        return known

    def build(self) -> Graph:
        """The graph; data tensors that no operator reads (folded buffers such as causal masks) are
        dropped."""
        read = {o.tensor for op in self._ops for o in op.inputs}
        tensors = tuple(t for t in self._tensors.values() if t.role != "data" or t.name in read)
        return Graph(self.name, tensors, tuple(self._ops), self.batch_dim, self.dim_names)
