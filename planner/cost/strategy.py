"""Sharding strategies of an operator and the layouts they imply.

A *strategy* gives, for each mesh axis, the op dim it splits or ``None``. A *layout* of a tensor
gives its placement on every mesh axis, encoded as small integers so layouts hash fast:

    Shard(i)  -> i >= 0   (tensor dimension i is split over the axis)
    REPLICATE -> -1
    PARTIAL   -> -2       (partial sums still to be reduced over the axis)
    GRAD_PARTIAL -> -3    (an input layout only: replicated in the forward pass, but the op
                           splits a dim absent from the input, so its gradient is Partial)

GRAD_PARTIAL is what makes one backward rule cover data-parallel gradient sync (a parameter)
and Megatron's ``f`` all-reduce (an activation): both are a Partial gradient to be reduced.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Sequence

from planner.ir.graph import Operand, Operator
from planner.cluster.mesh import Mesh

REPLICATE = -1
PARTIAL = -2
GRAD_PARTIAL = -3

Strategy = tuple[str | None, ...]
Layout = tuple[int, ...]


def placement_name(p: int) -> str:
    return {REPLICATE: "R", PARTIAL: "P", GRAD_PARTIAL: "R*"}.get(p, f"S({p})")


def layout_name(layout: Layout) -> str:
    return "[" + ",".join(placement_name(p) for p in layout) + "]"


def splittable_dims(op: Operator) -> list[str]:
    """Dims a mesh axis may split: not unsplittable, and never a non-leading dim of a merged
    group."""
    inner = {d for operand in op.inputs + op.outputs for group in operand.dims for d in group[1:]}
    return [d for d, _ in op.dims if d not in op.unsplittable and d not in inner]


def enumerate_strategies(op: Operator, mesh: Mesh) -> list[Strategy]:
    """Every valid strategy, in a fixed order (replicated first). Size-1 axes never split."""
    sizes = op.sizes
    dims = splittable_dims(op)
    choices = [[None] + (dims if axis.size > 1 else []) for axis in mesh.axes]
    return [
        tuple(strategy)
        for strategy in itertools.product(*choices)
        if divides(sizes, strategy, mesh)
    ]


def divides(sizes: dict[str, int], strategy: Strategy, mesh: Mesh) -> bool:
    """Every split dim's size is divisible by the product of the mesh axes that split it."""
    factor: dict[str, int] = {}
    for axis, dim in zip(mesh.axes, strategy):
        if dim is not None:
            factor[dim] = factor.get(dim, 1) * axis.size
    return all(d in sizes and sizes[d] % f == 0 for d, f in factor.items())


def parallel_degree(strategy: Strategy, mesh: Mesh) -> int:
    return math.prod(axis.size for axis, dim in zip(mesh.axes, strategy) if dim is not None)


def operand_layout(
    operand: Operand,
    strategy: Strategy,
    *,
    output: bool,
    needs_grad: bool = True,
    exact_grad_dims: frozenset[str] = frozenset(),
) -> Layout:
    """The layout the strategy implies for one operand (output or input).

    ``exact_grad_dims``: dims absent from an input whose split still leaves its gradient complete
    on every device (see ``bias_exact_dims``).
    """
    leading = {group[0]: i for i, group in enumerate(operand.dims)}
    layout = []
    for dim in strategy:
        if dim is None:
            layout.append(REPLICATE)
        elif dim in leading:
            layout.append(leading[dim])
        elif output:
            layout.append(PARTIAL)
        else:
            layout.append(GRAD_PARTIAL if needs_grad and dim not in exact_grad_dims else REPLICATE)
    return tuple(layout)


def bias_exact_dims(op: Operator, operand: Operand) -> frozenset[str]:
    """Reduction dims whose split leaves this input's gradient complete.

    A bias-like input (all its dims are output dims) is added after the reduction, so its
    gradient is a sum of the output gradient, which is replicated over an axis that splits a
    reduction dim (the gradient of a Partial output is Replicate). Megatron's row-parallel bias.
    """
    return _bias_exact(
        tuple(o.dims for o in op.outputs), operand.dims, tuple(o.dims for o in op.inputs)
    )


# a pure function of dims, asked once per (operator, input, strategy)
@functools.lru_cache(maxsize=4096)
def _bias_exact(outputs: tuple, own_dims: tuple, inputs: tuple) -> frozenset[str]:
    out_dims = {d for dims in outputs for group in dims for d in group}
    own = {d for group in own_dims for d in group}
    if not own <= out_dims:
        return frozenset()
    in_dims = {d for dims in inputs for group in dims for d in group}
    return frozenset(in_dims - out_dims)


def input_layout(op: Operator, slot: int, strategy: Strategy, needs_grad: bool) -> Layout:
    operand = op.inputs[slot]
    return operand_layout(
        operand,
        strategy,
        output=False,
        needs_grad=needs_grad,
        exact_grad_dims=bias_exact_dims(op, operand),
    )


def shard_factor(layout: Layout, mesh_shape: Sequence[int]) -> int:
    """How many pieces the tensor is cut into by its Shard placements."""
    return math.prod(size for p, size in zip(layout, mesh_shape) if p >= 0)


def layout_divides(shape: Sequence[int], layout: Layout, mesh_shape: Sequence[int]) -> bool:
    """Whether every tensor dim is a whole multiple of the number of blocks the layout cuts it
    into."""
    pieces = [1] * len(shape)
    for p, size in zip(layout, mesh_shape):
        if p >= 0:
            pieces[p] *= size
    return all(dim % n == 0 for dim, n in zip(shape, pieces))


def forward_layout(layout: Layout) -> Layout:
    """An input layout as seen in the forward pass (GRAD_PARTIAL is replicated)."""
    return tuple(REPLICATE if p == GRAD_PARTIAL else p for p in layout)


def gradient_layout(input_layout: Layout) -> Layout:
    """The layout of the gradient a consumer produces for one of its inputs."""
    return tuple(PARTIAL if p == GRAD_PARTIAL else p for p in input_layout)


def gradient_target(output_layout: Layout) -> Layout:
    """The layout in which a producer needs the gradient of its output (Partial -> Replicate)."""
    return tuple(REPLICATE if p == PARTIAL else p for p in output_layout)
