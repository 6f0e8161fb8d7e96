"""Run a plan on virtual devices with numpy: local shards, literal collectives (docs/engines.md).

Each tensor lives as one local array per device coordinate plus a layout (per mesh axis: Shard of a
tensor dim, Replicate or Partial, as in ``planner.cost.strategy``). Operators run on local shards
with their local dim sizes; a mesh axis on a reduction dim leaves Partial sums; a bias is added on
one shard only. Layouts change by per-axis collectives over the devices that differ only in that
axis (all-gather = concatenate, all-reduce = sum, reduce-scatter = sum then keep a block, all-to-all
= gather then keep a block, local slice). When several axes shard one tensor dim, the first axis in
mesh order holds the major block. Two documented deviations, exact in value: an operator that splits
a normalised dim (layer norm, softmax, loss over classes; batch norm's batch) gathers that dim
before it runs and slices after (the cost model charges the statistics all-reduce instead), and a
gather on an axis that is not the innermost of its dim gathers the inner axes too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from planner.ir.graph import Graph
from planner.engines.interpret import BIAS, letters, random_feeds, run_graph, run_operator
from planner.cluster.mesh import Mesh
from planner.cost.redistribution import redistribution_steps
from planner.cost.strategy import (
    PARTIAL,
    REPLICATE,
    Layout,
    Strategy,
    forward_layout,
    input_layout,
    operand_layout,
)

Coord = tuple[int, ...]


@dataclass(slots=True)
class Sharded:
    """A tensor on virtual devices: a local array per mesh coordinate and its layout."""

    local: dict[Coord, np.ndarray]
    layout: Layout
    shape: tuple[int, ...]


def _axes_of_dim(layout: Layout, dim: int) -> list[int]:
    return [ax for ax, p in enumerate(layout) if p == dim]


def block(
    shape: tuple[int, ...], layout: Layout, mesh_shape: tuple[int, ...], coord: Coord
) -> tuple[slice, ...]:
    """The global index range a device holds under a layout (Shard blocks, major axis first)."""
    index = []
    for dim, size in enumerate(shape):
        pieces, position = 1, 0
        for ax in _axes_of_dim(layout, dim):
            pieces *= mesh_shape[ax]
            position = position * mesh_shape[ax] + coord[ax]
        width = size // pieces
        index.append(slice(position * width, (position + 1) * width))
    return tuple(index)


def coords(mesh_shape: tuple[int, ...]) -> list[Coord]:
    return list(itertools.product(*(range(n) for n in mesh_shape)))


def scatter(value: np.ndarray, layout: Layout, mesh_shape: tuple[int, ...]) -> Sharded:
    """Place a global (replicated) value on the devices under a layout without Partial."""
    return Sharded(
        {c: value[block(value.shape, layout, mesh_shape, c)] for c in coords(mesh_shape)},
        tuple(layout),
        value.shape,
    )


def _group(c: Coord, axis: int, size: int) -> list[Coord]:
    return [c[:axis] + (k,) + c[axis + 1 :] for k in range(size)]


def _all_reduce(t: Sharded, axis: int, mesh_shape) -> Sharded:
    local = {c: sum(t.local[g] for g in _group(c, axis, mesh_shape[axis])) for c in t.local}
    return Sharded(local, _set(t.layout, axis, REPLICATE), t.shape)


def _gather(t: Sharded, axis: int, mesh_shape) -> Sharded:
    """All-gather on ``axis``: concatenate the group's blocks along the sharded dim."""
    dim = t.layout[axis]
    inner = [ax for ax in _axes_of_dim(t.layout, dim) if ax > axis]
    for ax in sorted(inner, reverse=True):  # not innermost: gather the inner axes first
        t = _gather(t, ax, mesh_shape)
    local = {
        c: np.concatenate([t.local[g] for g in _group(c, axis, mesh_shape[axis])], axis=dim)
        for c in t.local
    }
    out = Sharded(local, _set(t.layout, axis, REPLICATE), t.shape)
    for ax in sorted(inner):
        out = _slice(out, ax, dim, mesh_shape)
    return out


def _slice(t: Sharded, axis: int, dim: int, mesh_shape) -> Sharded:
    """Replicate -> Shard(dim) on ``axis``: keep this device's block (free)."""
    inner = [ax for ax in _axes_of_dim(t.layout, dim) if ax > axis]
    if inner:  # the new axis becomes the major block: regroup the inner axes around it
        for ax in sorted(inner, reverse=True):
            t = _gather(t, ax, mesh_shape)
        t = _slice(t, axis, dim, mesh_shape)
        for ax in sorted(inner):
            t = _slice(t, ax, dim, mesh_shape)
        return t
    layout = _set(t.layout, axis, dim)
    local = {}
    for c, value in t.local.items():
        have = block(t.shape, t.layout, mesh_shape, c)[dim]
        want = block(t.shape, layout, mesh_shape, c)[dim]
        index = [slice(None)] * value.ndim
        index[dim] = slice(want.start - have.start, want.stop - have.start)
        local[c] = value[tuple(index)]
    return Sharded(local, layout, t.shape)


def _set(layout: Layout, axis: int, placement: int) -> Layout:
    return tuple(placement if ax == axis else p for ax, p in enumerate(layout))


def redistribute(t: Sharded, dst: Layout, mesh_shape: tuple[int, ...]) -> Sharded:
    """Perform the cost model's redistribution steps (``planner.cost.redistribution``) on local
    shards: a reduce-scatter is an all-reduce that keeps its block, an all-to-all a gather that
    keeps its block, and the hierarchical all-reduce one all-reduce per axis. A Partial target
    placement (an output whose reduction dim was gathered locally) keeps a replicated value."""
    dst = tuple(
        have if want == PARTIAL and have in (PARTIAL, REPLICATE) else want
        for have, want in zip(t.layout, dst)
    )
    for step in redistribution_steps(t.shape, t.layout, dst, mesh_shape):
        ax = step.axes[0]
        if step.kind in ("reduce_scatter", "all_reduce"):
            for axis in step.axes:
                t = _all_reduce(t, axis, mesh_shape)
        if step.kind in ("all_to_all", "all_gather"):
            t = _gather(t, ax, mesh_shape)
        if step.kind in ("slice", "reduce_scatter", "all_to_all"):
            t = _slice(t, ax, step.after[ax], mesh_shape)
    return t


def gathered_dims(op, strategy: Strategy) -> set[str]:
    norm = set(op.norm_dims) | ({letters(op.inputs[0])[0]} if op.kind == "batchnorm" else set())
    if op.kind == "cross_entropy":
        norm |= {letters(op.inputs[0])[-1]}
    return {d for d in strategy if d in norm}


def gathered_strategy(op, strategy: Strategy) -> Strategy:
    """``strategy`` less the mesh axes that split a dim the operator normalises over: runners
    gather those dims first and run the operator whole on those axes."""
    gathered = gathered_dims(op, strategy)
    return tuple(None if d in gathered else d for d in strategy) if gathered else strategy


def run_op(
    graph: Graph, op, strategy: Strategy, inputs: list[Sharded], mesh: Mesh
) -> list[Sharded]:
    """One operator under one strategy on every device."""
    mesh_shape = mesh.shape
    local_strategy = gathered_strategy(op, strategy)
    args = []
    grads = graph.grad_tensors()
    for slot, t in enumerate(inputs):
        needs_grad = op.inputs[slot].tensor in grads
        args.append(
            redistribute(
                t, forward_layout(input_layout(op, slot, local_strategy, needs_grad)), mesh_shape
            )
        )
    outs_layout = [operand_layout(o, local_strategy, output=True) for o in op.outputs]
    results: list[dict[Coord, np.ndarray]] = [{} for _ in op.outputs]
    for c in coords(mesh_shape):
        sizes, offsets = dict(op.sizes), {}
        for ax, dim in enumerate(local_strategy):
            if dim is not None:
                sizes[dim] //= mesh_shape[ax]
        for dim in sizes:
            axes = [ax for ax, d in enumerate(local_strategy) if d == dim]
            position = 0
            for ax in axes:
                position = position * mesh_shape[ax] + c[ax]
            offsets[dim] = position * sizes[dim]
        partial_axes = [ax for ax, p in enumerate(outs_layout[0]) if p == PARTIAL]
        offsets[BIAS] = int(all(c[ax] == 0 for ax in partial_axes))
        for k, value in enumerate(run_operator(op, [a.local[c] for a in args], np, sizes, offsets)):
            results[k][c] = value
    outs = [
        Sharded(r, layout, op.operand_shape(o))
        for r, layout, o in zip(results, outs_layout, op.outputs)
    ]
    final = [operand_layout(o, strategy, output=True) for o in op.outputs]
    return [redistribute(t, want, mesh_shape) for t, want in zip(outs, final)]


def execute(
    graph: Graph, strategies: dict[str, Strategy], mesh: Mesh, feeds: dict[str, np.ndarray]
) -> dict[str, Sharded]:
    """Run the plan forward on virtual devices; returns every activation as a ``Sharded``."""
    env: dict[str, Sharded] = {}
    mesh_shape = mesh.shape
    for op in graph.operators:
        strategy = strategies[op.name]
        inputs, grads = [], graph.grad_tensors()
        for slot, operand in enumerate(op.inputs):
            if operand.tensor in env:
                inputs.append(env[operand.tensor])
            else:  # a parameter or data tensor: placed directly in the layout this consumer reads
                needs_grad = operand.tensor in grads
                layout = forward_layout(input_layout(op, slot, strategy, needs_grad))
                inputs.append(scatter(feeds[operand.tensor], layout, mesh_shape))
        for operand, value in zip(op.outputs, run_op(graph, op, strategy, inputs, mesh)):
            env[operand.tensor] = value
    return env


def check_plan(
    graph: Graph, strategies: dict[str, Strategy], mesh: Mesh, seed: int = 0
) -> dict[str, float]:
    """Largest relative error, per activation, between the plan on virtual devices and the
    unsharded forward (both float64). Every device's copy is compared after an all-gather."""
    feeds = random_feeds(graph, seed)
    reference = run_graph(graph, feeds, np)
    sharded = execute(graph, strategies, mesh, feeds)
    errors = {}
    for name, t in sharded.items():
        whole = redistribute(t, tuple(REPLICATE for _ in mesh.shape), mesh.shape)
        want = reference[name]
        scale = max(float(np.max(np.abs(want))), 1e-30)
        errors[name] = max(float(np.max(np.abs(v - want))) / scale for v in whole.local.values())
    return errors
