"""Operator costs (DESIGN section 4): the volumes one operator under one strategy costs per device.

Per operator (forward + backward): compute flops/P(s) forward, backward_factor times that
backward, one more forward under recompute; splitting a normalised dim all-reduces the
statistics in both passes; a parameter whose op splits a dim absent from it gets a Partial
gradient, all-reduced per use (tied weights: once per consumer, as XLA does) (reduce-scatter + all-gather under ZeRO >= 1, a second
all-gather under ZeRO-3). Edges are costed in ``planner.cost.redistribution``.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cluster.mesh import Mesh
from planner.cost.collectives import Collective, hierarchical_all_reduce
from planner.cost.records import CostRecord, Memory, merge_comm
from planner.cost.settings import INTEGER_BYTES, TrainingSettings
from planner.cost.strategy import (GRAD_PARTIAL, Layout, Strategy, input_layout, operand_layout, parallel_degree,
                                   shard_factor)
from planner.ir.graph import Graph, Operator


@dataclass(frozen=True, slots=True)
class OperandInfo:
    """Facts of one operator input that the cost model needs from the graph."""

    shape: tuple[int, ...]
    role: str
    needs_grad: bool
    elem_bytes: int
    counts_memory: bool  # this op owns the tensor's parameter state or saved activation
    grad_free: bool = False  # the op sums its input to a scalar: the input's gradient is a broadcast

    @property
    def edge_grad(self) -> bool:
        """Whether the edge into this input carries a gradient back that may need moving. The
        gradient of a full sum is the (replicated) scalar's gradient broadcast, which every device
        materialises locally in whatever layout the producer needs (XLA emits no collective)."""
        return self.needs_grad and not self.grad_free


def operand_infos(graph: Graph, settings: TrainingSettings) -> dict[str, tuple[OperandInfo, ...]]:
    """Per operator, its inputs' facts. A tensor's memory is counted once, at its first consumer."""
    owner: dict[str, str] = {}
    for op in graph.operators:
        for operand in op.inputs:
            t = graph.tensor(operand.tensor)
            if t.role == "param" or (operand.saved and (t.checkpoint or not settings.recompute)):
                owner.setdefault(t.name, op.name)
    infos = {}
    grads = graph.grad_tensors()
    for op in graph.operators:
        row = []
        full_sum = op.kind == "reduce" and all(not o.dims for o in op.outputs)
        for operand in op.inputs:
            t = graph.tensor(operand.tensor)
            row.append(OperandInfo(t.shape, t.role, t.name in grads, INTEGER_BYTES if t.integer else settings.elem_bytes,
                                   owner.get(t.name) == op.name, full_sum))
        infos[op.name] = tuple(row)
    return infos


def op_cost(op: Operator, strategy: Strategy, mesh: Mesh, settings: TrainingSettings,
            inputs: tuple[OperandInfo, ...]) -> CostRecord:
    """Cost of one operator under one strategy, for one training step, per device."""
    mesh_shape = mesh.shape
    degree = parallel_degree(strategy, mesh)
    fwd = op.flops / degree
    comm: list[Collective] = []
    sizes = op.sizes
    if op.norm_dims:
        stats = op.norm_stats * settings.elem_bytes
        for dim in sizes:
            if dim not in op.norm_dims:
                stats *= sizes[dim]
        local = stats / parallel_degree(tuple(d if d not in op.norm_dims else None for d in strategy), mesh)
        for ax, dim in enumerate(strategy):
            if dim in op.norm_dims:
                comm.append(Collective("fwd", "all_reduce", ax, local))
                comm.append(Collective("bwd", "all_reduce", ax, local))
    if inputs and inputs[0].grad_free:  # a loss summed over split dims: the scalar is all-reduced
        split = [ax for ax, dim in enumerate(strategy) if dim is not None and mesh_shape[ax] > 1]
        comm.extend(hierarchical_all_reduce("fwd", split, settings.elem_bytes, mesh_shape))
    memory = Memory()
    for slot, info in enumerate(inputs):
        layout = input_layout(op, slot, strategy, info.needs_grad)
        numel = 1.0
        for s in info.shape:
            numel *= s
        numel /= shard_factor(layout, mesh_shape)
        if info.role == "param":
            param_comm, param_memory = _param_cost(numel, layout, mesh_shape, settings, info.counts_memory)
            comm.extend(param_comm)
            memory = memory + param_memory
        elif info.counts_memory:
            memory = memory + Memory(activations=numel * info.elem_bytes)
    recompute = fwd if settings.recompute else 0.0
    return CostRecord(fwd, fwd * op.backward_factor + recompute, merge_comm(tuple(comm)), memory)


def _param_cost(numel: float, layout: Layout, mesh_shape: tuple[int, ...], settings: TrainingSettings,
                counts_memory: bool) -> tuple[list[Collective], Memory]:
    dp_axes = [ax for ax, p in enumerate(layout) if p == GRAD_PARTIAL and mesh_shape[ax] > 1]
    nbytes = numel * settings.elem_bytes
    comm: list[Collective] = []
    # A parameter read by several operators (tied embeddings) has its gradient reduced once per
    # use: XLA's SPMD partitioner reduces each use's partial gradient where it is computed
    # (measured by `planner verify`); a framework that accumulates first pays less.
    if settings.zero == 0:
        comm = hierarchical_all_reduce("grad", dp_axes, nbytes, mesh_shape)
    else:
        buffer = nbytes
        for ax in dp_axes:
            comm.append(Collective("grad", "reduce_scatter", ax, buffer))
            if settings.zero == 3:  # parameters gathered before use, in both passes
                comm.append(Collective("fwd", "all_gather", ax, buffer))
                comm.append(Collective("bwd", "all_gather", ax, buffer))
            else:  # updated shards gathered after the optimizer step
                comm.append(Collective("opt", "all_gather", ax, buffer))
            buffer /= mesh_shape[ax]
    if not counts_memory:
        return comm, Memory()
    dp = 1
    for ax in dp_axes:
        dp *= mesh_shape[ax]
    z = settings.zero
    memory = Memory(params=nbytes / (dp if z >= 3 else 1), grads=nbytes / (dp if z >= 2 else 1),
                    optimizer=numel * settings.optimizer_bytes / (dp if z >= 1 else 1))
    return comm, memory


def output_layouts(op: Operator, strategy: Strategy) -> tuple[Layout, ...]:
    return tuple(operand_layout(o, strategy, output=True) for o in op.outputs)


def input_layouts(op: Operator, strategy: Strategy, inputs: tuple[OperandInfo, ...]) -> tuple[Layout, ...]:
    return tuple(input_layout(op, slot, strategy, info.needs_grad) for slot, info in enumerate(inputs))
