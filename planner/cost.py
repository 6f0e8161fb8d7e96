"""The symbolic cost model (DESIGN section 4).

Costs are first *volumes* (FLOPs, bytes per collective kind per mesh axis and phase, bytes of
memory per device) held in a ``CostRecord``; ``seconds`` weighs them with a machine profile.
Collective times on one axis of size p, bandwidth B, latency a, for n bytes (ring algorithms):

    all_gather, reduce_scatter, all_to_all:  (p-1)*a + (p-1)/p * n/B
    all_reduce:                           2*(p-1)*a + 2*(p-1)/p * n/B
    p2p:                                            a + n/B

Per operator (forward + backward): compute flops/P(s) forward, backward_factor times that
backward, one more forward under recompute; splitting a normalised dim all-reduces the
statistics in both passes; a parameter whose op splits a dim absent from it gets a Partial
gradient, all-reduced per use (tied weights: once per consumer, as XLA does) (reduce-scatter + all-gather under ZeRO >= 1, a second
all-gather under ZeRO-3). Per edge: the forward redistribution producer -> consumer and the
transposed redistribution of the gradient, one mesh axis at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.errors import SettingsError
from planner.graph import Graph, Operator
from planner.mesh import MachineProfile, Mesh
from planner.strategy import (GRAD_PARTIAL, PARTIAL, REPLICATE, Layout, Strategy, forward_layout,
                              gradient_layout, gradient_target, input_layout, operand_layout, parallel_degree,
                              shard_factor)

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "p2p")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
INTEGER_BYTES = 4
# Optimizer state bytes per parameter: mixed precision keeps an fp32 master copy.
OPTIMIZER_BYTES = {("adam", "bf16"): 12, ("adam", "fp16"): 12, ("adam", "fp32"): 8,
                   ("sgd", "bf16"): 8, ("sgd", "fp16"): 8, ("sgd", "fp32"): 4}


@dataclass(frozen=True, slots=True)
class TrainingSettings:
    """What a training step does: dtype, optimizer, ZeRO stage on data-parallel axes, recompute."""

    dtype: str = "bf16"
    optimizer: str = "adam"
    zero: int = 0
    recompute: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise SettingsError(f"--dtype: must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.optimizer not in ("adam", "sgd"):
            raise SettingsError(f"--optimizer: must be adam or sgd, got {self.optimizer!r}")
        if self.zero not in (0, 1, 2, 3):
            raise SettingsError(f"--zero: must be 0, 1, 2 or 3, got {self.zero!r}")

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def optimizer_bytes(self) -> int:
        return OPTIMIZER_BYTES[(self.optimizer, self.dtype)]


@dataclass(frozen=True, slots=True)
class Memory:
    params: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations

    def __add__(self, other: "Memory") -> "Memory":
        return Memory(self.params + other.params, self.grads + other.grads,
                      self.optimizer + other.optimizer, self.activations + other.activations)


@dataclass(frozen=True, slots=True)
class Collective:
    """Bytes moved by ``count`` collectives of one kind on one mesh axis in one phase."""

    phase: str  # fwd | bwd (per micro-batch) | grad (gradient sync) | opt (after the optimizer step)
    kind: str
    axis: int
    nbytes: float
    count: int = 1


@dataclass(frozen=True, slots=True)
class CostRecord:
    """Symbolic cost of a piece of the plan: per-device FLOPs, collectives, memory."""

    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    comm: tuple[Collective, ...] = ()
    memory: Memory = field(default_factory=Memory)

    def __add__(self, other: "CostRecord") -> "CostRecord":
        return CostRecord(self.fwd_flops + other.fwd_flops, self.bwd_flops + other.bwd_flops,
                          merge_comm(self.comm + other.comm), self.memory + other.memory)

    def comm_bytes(self, kind: str | None = None, axis: int | None = None, phase: str | None = None) -> float:
        return sum(c.nbytes for c in self.comm if (kind is None or c.kind == kind)
                   and (axis is None or c.axis == axis) and (phase is None or c.phase == phase))


def sum_records(records: "list[CostRecord] | tuple[CostRecord, ...]") -> CostRecord:
    """Sum many records at once (one merge of the collectives instead of one per addition)."""
    comm: list[Collective] = []
    fwd = bwd = 0.0
    params = grads = optimizer = activations = 0.0
    for r in records:
        fwd += r.fwd_flops
        bwd += r.bwd_flops
        comm.extend(r.comm)
        m = r.memory
        params, grads, optimizer, activations = (params + m.params, grads + m.grads, optimizer + m.optimizer,
                                                 activations + m.activations)
    return CostRecord(fwd, bwd, merge_comm(tuple(comm)), Memory(params, grads, optimizer, activations))


def merge_comm(comm: tuple[Collective, ...]) -> tuple[Collective, ...]:
    acc: dict[tuple[str, str, int], list[float]] = {}
    for c in comm:
        slot = acc.setdefault((c.phase, c.kind, c.axis), [0.0, 0])
        slot[0] += c.nbytes
        slot[1] += c.count
    return tuple(Collective(p, k, a, n, int(cnt)) for (p, k, a), (n, cnt) in sorted(acc.items()))


def bytes_sent(kind: str, size: int, nbytes: float) -> float:
    """Bytes one device sends in a ring collective of ``nbytes`` over ``size`` devices (p2p: all of them)."""
    if kind == "p2p":
        return nbytes
    if size <= 1:
        return 0.0
    return (2.0 if kind == "all_reduce" else 1.0) * (size - 1) / size * nbytes


def collective_seconds(kind: str, size: int, bandwidth: float, latency: float, nbytes: float, count: int = 1) -> float:
    """Ring alpha-beta time of ``count`` collectives moving ``nbytes`` in total on one axis."""
    if kind == "p2p":
        return count * latency + bytes_sent(kind, size, nbytes) / bandwidth
    if size <= 1:
        return 0.0
    steps = (2 if kind == "all_reduce" else 1) * (size - 1)
    return steps * latency * count + bytes_sent(kind, size, nbytes) / bandwidth


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    compute_s: float
    comm_s: float
    comm_by_kind_s: tuple[tuple[str, float], ...]
    comm_by_axis_s: tuple[tuple[str, float], ...]

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s


def seconds(record: CostRecord, mesh: Mesh, profile: MachineProfile) -> float:
    """Estimated time of a cost record (no overlap of communication with compute)."""
    return breakdown(record, mesh, profile).total_s


def breakdown(record: CostRecord, mesh: Mesh, profile: MachineProfile) -> TimeBreakdown:
    compute = profile.compute_weight * (record.fwd_flops + record.bwd_flops) / profile.flops_per_second
    by_kind: dict[str, float] = {}
    by_axis: dict[str, float] = {}
    for c in record.comm:
        if c.axis < 0:  # pipeline p2p: carries its own link in the axis slot of the stage mesh
            axis = mesh.axes[-1]
        else:
            axis = mesh.axes[c.axis]
        t = collective_seconds(c.kind, axis.size, axis.bandwidth, axis.latency, c.nbytes, c.count)
        by_kind[c.kind] = by_kind.get(c.kind, 0.0) + t
        by_axis[axis.name] = by_axis.get(axis.name, 0.0) + t
    return TimeBreakdown(compute, sum(by_kind.values()), tuple(sorted(by_kind.items())), tuple(sorted(by_axis.items())))


# ---------------------------------------------------------------- redistribution


def redistribute(shape: tuple[int, ...], elem_bytes: int, src: Layout, dst: Layout,
                 mesh_shape: tuple[int, ...], phase: str) -> tuple[Collective, ...]:
    """Collectives that turn layout ``src`` into ``dst``, one mesh axis at a time.

    Order: local slices, then reduce-scatters (both shrink data), all-to-alls, all-reduces,
    and all-gathers last, so every collective moves the smallest buffer it can.
    """
    numel = 1.0
    for s in shape:
        numel *= s
    cur = list(src)

    def local_bytes() -> float:
        return numel * elem_bytes / shard_factor(tuple(cur), mesh_shape)

    out: list[Collective] = []
    axes = range(len(cur))
    for ax in axes:
        if dst[ax] >= 0 and cur[ax] == REPLICATE:
            cur[ax] = dst[ax]
    for ax in axes:
        if dst[ax] >= 0 and cur[ax] == PARTIAL:
            out.append(Collective(phase, "reduce_scatter", ax, local_bytes()))
            cur[ax] = dst[ax]
    for ax in axes:
        if dst[ax] >= 0 and cur[ax] >= 0 and cur[ax] != dst[ax]:
            out.append(Collective(phase, "all_to_all", ax, local_bytes()))
            cur[ax] = dst[ax]
    pending = [ax for ax in axes if dst[ax] == REPLICATE and cur[ax] == PARTIAL and mesh_shape[ax] > 1]
    out.extend(hierarchical_all_reduce(phase, pending, local_bytes(), mesh_shape))
    for ax in axes:
        if dst[ax] == REPLICATE and cur[ax] == PARTIAL:
            cur[ax] = REPLICATE
    for ax in axes:
        if dst[ax] == REPLICATE and cur[ax] >= 0:
            cur[ax] = REPLICATE
            out.append(Collective(phase, "all_gather", ax, local_bytes()))
    return tuple(c for c in out if mesh_shape[c.axis] > 1)


def hierarchical_all_reduce(phase: str, axes: list[int], nbytes: float,
                            mesh_shape: tuple[int, ...]) -> list[Collective]:
    """All-reduce of ``nbytes`` over several mesh axes (outermost first): reduce-scatter on the
    inner axes (innermost first), all-reduce of the scattered buffer on the outermost axis,
    all-gather back. It moves the bytes of one flat ring all-reduce over all those devices."""
    if not axes:
        return []
    out, buffer = [], nbytes
    for ax in reversed(axes[1:]):
        out.append(Collective(phase, "reduce_scatter", ax, buffer))
        buffer /= mesh_shape[ax]
    out.append(Collective(phase, "all_reduce", axes[0], buffer))
    for ax in axes[1:]:
        buffer *= mesh_shape[ax]
        out.append(Collective(phase, "all_gather", ax, buffer))
    return out


def edge_cost(shape: tuple[int, ...], elem_bytes: int, producer_layout: Layout, consumer_layout: Layout,
              mesh_shape: tuple[int, ...], needs_grad: bool) -> CostRecord:
    """Forward redistribution producer -> consumer plus, if needed, its transposed gradient."""
    comm = redistribute(shape, elem_bytes, producer_layout, forward_layout(consumer_layout), mesh_shape, "fwd")
    if needs_grad:
        comm += redistribute(shape, elem_bytes, gradient_layout(consumer_layout), gradient_target(producer_layout),
                             mesh_shape, "bwd")
    return CostRecord(comm=comm)


# ---------------------------------------------------------------- operators


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
