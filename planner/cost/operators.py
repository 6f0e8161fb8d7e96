"""Operator costs (docs/cost-model.md): what one operator under one strategy costs per device.

Per operator (forward + backward): compute flops/P(s) forward, backward_factor times that backward,
one more forward when the op is re-run (full recompute: every op; selective: the attention core of
``attention_core``), timed by the roofline of ``planner.cost.compute``; saved activations as
``_saved_activation`` keeps them (sequence parallelism: 1/t and a re-gather in the backward pass);
splitting a normalised dim all-reduces the statistics in both passes; a parameter whose op splits a
dim absent from it gets a Partial gradient, all-reduced per use (tied weights: once per consumer, as
XLA does) (reduce-scatter + all-gather under ZeRO >= 1, a second all-gather under ZeRO-3). Parameter
collectives are issued per gradient bucket (``bucket_share``: tensors packed into buckets of
``bucket_bytes``, a tensor larger than a bucket is one collective of its own, latency paid once per
collective, as DDP, FSDP2 and Megatron's distributed optimizer issue them) and, with overlap, hidden
behind the operator's own compute: hidden = min(gradient reduction, backward compute) (+ min(ZeRO-3
gather, forward) under ``full``). Charging each operator max(0, comm - its compute) keeps every term
a constant of (operator, strategy), so the program stays linear and the decomposition exact; for a
stack of identical layers it equals the global max(0, sum comm - sum hideable compute). The
optimizer step is HBM-bound: it reads the gradient and the optimizer state and writes state and
weights. Edges are costed in ``planner.cost.redistribution``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from planner.cluster.mesh import Mesh
from planner.cluster.profiles import MachineProfile
from planner.cost.collectives import Collective, collective_seconds, hierarchical_all_reduce
from planner.cost.compute import Fp8Casts, op_seconds
from planner.cost.records import CostRecord, Memory, merge_comm
from planner.cost.settings import AUTO, TrainingSettings
from planner.cost.strategy import (
    GRAD_PARTIAL,
    Layout,
    Strategy,
    input_layout,
    operand_layout,
    parallel_degree,
    shard_factor,
)
from planner.errors import SettingsError
from planner.ir.graph import Graph, Operator
from planner.ir.ops import REGISTRY
from planner.cost.operands import OperandInfo


def op_costs(graph: Graph, mesh: Mesh, profile: MachineProfile, settings: TrainingSettings) -> dict:
    """The records ``op_cost`` gave on this graph under (mesh, profile, settings), by (signature id,
    strategy): a problem's tables and the plans a search re-costs on the same graph share them."""
    return graph.derived(("op_costs", mesh, profile, settings), dict)


def op_cost(
    op: Operator,
    strategy: Strategy,
    mesh: Mesh,
    settings: TrainingSettings,
    inputs: tuple[OperandInfo, ...],
    profile: MachineProfile,
) -> CostRecord:
    """Cost of one operator under one strategy, for one training step, per device."""
    mesh_shape = mesh.shape
    fwd = op.flops / parallel_degree(strategy, mesh)
    comm = _norm_comm(op, strategy, mesh, settings)
    if inputs and inputs[0].grad_free:  # a loss summed over split dims: the scalar is all-reduced
        split = [ax for ax, dim in enumerate(strategy) if dim is not None and mesh_shape[ax] > 1]
        comm.extend(hierarchical_all_reduce("fwd", split, settings.elem_bytes, mesh_shape))
    memory, param_comm, in_bytes, opt_bytes = _inputs_cost(
        op, strategy, mesh_shape, settings, inputs
    )
    out_bytes = sum(
        math.prod(op.operand_shape(operand))
        / shard_factor(layout, mesh_shape)
        * settings.elem_bytes
        for operand, layout in zip(op.outputs, output_layouts(op, strategy))
    )
    casts = _fp8_casts(op, settings, profile, inputs, in_bytes, out_bytes)
    time = op_seconds(op, strategy, mesh, profile, fwd, in_bytes + out_bytes, casts)
    rerun = bool(inputs) and inputs[0].rerun
    bwd_s = time.bwd_s + (time.fwd_s if rerun else 0.0)
    opt_s = (
        opt_bytes / profile.hbm_bandwidth if profile.roofline and profile.hbm_bandwidth > 0 else 0.0
    )
    hidden_pass, hidden_sync = _hidden_seconds(
        param_comm, time.fwd_s, bwd_s, mesh, settings.overlap
    )
    recompute = fwd if rerun else 0.0
    return CostRecord(
        fwd,
        fwd * op.backward_factor + recompute,
        merge_comm(tuple(comm + param_comm)),
        memory,
        time.fwd_s,
        bwd_s,
        opt_s,
        hidden_pass,
        hidden_sync,
        time.fwd_s if rerun else 0.0,
    )


def _fp8_casts(
    op: Operator,
    settings: TrainingSettings,
    profile: MachineProfile,
    inputs: tuple[OperandInfo, ...],
    in_bytes: float,
    out_bytes: float,
) -> Fp8Casts | None:
    """Under dtype fp8, a linear layer's casts (``planner.cost.compute``): a contraction of an
    activation with a parameter inside the repeated layers; None for every other operator."""
    if settings.dtype != "fp8":
        return None
    if profile.fp8_flops <= 0:
        raise SettingsError(
            f"dtype: fp8 needs FP8 tensor cores, and device {profile.name} has none (its "
            "profile's fp8_flops, the hardware table's peak_fp8_flops, is 0)"
        )
    linear = (
        REGISTRY[op.kind].category == "contraction"
        and len(op.inputs) > 1
        and op.layer is not None
        and any(info.role == "param" for info in inputs)
    )
    return Fp8Casts(in_bytes, out_bytes) if linear else None


def _inputs_cost(op: Operator, strategy: Strategy, mesh_shape, settings: TrainingSettings, inputs):
    """What the operator's inputs hold and move per device: (memory, the collectives of its
    parameters and re-gathered activations, bytes read, optimizer bytes per step)."""
    memory, param_comm, io_bytes, opt_bytes = Memory(), [], 0.0, 0.0
    for slot, info in enumerate(inputs):
        layout = input_layout(op, slot, strategy, info.needs_grad)
        numel = math.prod(info.shape) / shard_factor(layout, mesh_shape)
        io_bytes += numel * info.elem_bytes
        if info.role == "param":
            collectives, param_memory, step_bytes = _param_cost(
                numel, layout, mesh_shape, settings, info
            )
            param_comm.extend(collectives)
            memory, opt_bytes = memory + param_memory, opt_bytes + step_bytes
        elif info.counts_memory:
            kept, regather = _saved_activation(numel, layout, mesh_shape, settings, info.elem_bytes)
            memory = memory + Memory(activations=kept * (info.saved_bytes or info.elem_bytes))
            param_comm.extend(regather)
    return memory, param_comm, io_bytes, opt_bytes


def _saved_activation(
    numel: float,
    layout: Layout,
    mesh_shape: tuple[int, ...],
    settings: TrainingSettings,
    elem_bytes: int,
) -> tuple[float, list[Collective]]:
    """Elements of a saved activation kept per device, and the collectives that restore it for the
    backward pass. Under sequence parallelism an input read replicated by an op that splits other
    dims over an axis is kept 1/size per device and all-gathered again in the backward pass
    (Megatron-LM's sequence-parallel linear, which overlaps that gather with its backward GEMM)."""
    axes = [ax for ax, p in enumerate(layout) if p == GRAD_PARTIAL and mesh_shape[ax] > 1]
    if not settings.sequence_parallel or not axes:
        return numel, []
    kept = numel / math.prod(mesh_shape[ax] for ax in axes)
    regather, buffer = [], kept * elem_bytes
    for ax in reversed(axes):  # innermost first, as the redistribution gathers
        buffer *= mesh_shape[ax]
        regather.append(Collective("bwd", "all_gather", ax, buffer))
    return kept, regather


def _norm_comm(
    op: Operator, strategy: Strategy, mesh: Mesh, settings: TrainingSettings
) -> list[Collective]:
    """Splitting a normalised dim all-reduces the statistics, forward and backward."""
    if not op.norm_dims:
        return []
    sizes = op.sizes
    stats = (
        op.norm_stats
        * settings.elem_bytes
        * math.prod(sizes[d] for d in sizes if d not in op.norm_dims)
    )
    local = stats / parallel_degree(
        tuple(d if d not in op.norm_dims else None for d in strategy), mesh
    )
    return [
        Collective(phase, "all_reduce", ax, local)
        for ax, dim in enumerate(strategy)
        if dim in op.norm_dims
        for phase in ("fwd", "bwd")
    ]


def _hidden_seconds(
    param_comm: list[Collective], fwd_s: float, bwd_s: float, mesh: Mesh, overlap: str
) -> tuple[float, float]:
    """Seconds of this operator's parameter collectives that run behind its own compute, per pass
    and per step: with ``grad`` the gradient reduction behind the backward pass (ZeRO-2/3's every
    micro-batch, a pass's; otherwise the step's); with ``full`` first the gathers (ZeRO-3's,
    prefetched; sequence parallelism's re-gather of a saved input), then the reduction behind what
    is left of the backward pass."""
    if overlap == "none":
        return 0.0, 0.0
    spent = dict.fromkeys(("fwd", "bwd", "reduce", "grad", "opt"), 0.0)
    for c in param_comm:
        axis = mesh.axes[c.axis]
        spent[c.phase] += collective_seconds(
            c.kind, axis.size, axis.bandwidth, axis.latency, c.nbytes, c.count
        )
    gathers = 0.0 if overlap == "grad" else min(spent["fwd"], fwd_s) + min(spent["bwd"], bwd_s)
    left = bwd_s - (0.0 if overlap == "grad" else min(spent["bwd"], bwd_s))
    reduce = min(spent["reduce"], left)
    return gathers + reduce, min(spent["grad"], left - reduce)


def bucket_share(tensor_bytes: float, bucket_bytes: float) -> float:
    """The collectives one parameter tensor issues under gradient buckets of ``bucket_bytes``.

    DDP (``bucket_cap_mb``), FSDP2 and Megatron-LM's distributed optimizer pack tensors into a
    bucket until it holds ``bucket_bytes``; a tensor at least that large is a bucket, and one
    collective, of its own. Latency is paid once per collective, so a small tensor pays its share
    ``tensor_bytes / bucket_bytes`` of one bucket's latency and a large one exactly one collective's
    (slicing it into bucket-sized pieces would charge latency the engines never pay). 0 bytes: one
    collective per tensor."""
    if bucket_bytes <= 0:
        return 1.0
    return min(1.0, tensor_bytes / bucket_bytes)


def _sharded_param_comm(z: int, dp_axes, nbytes: float, grad_nbytes: float, mesh_shape) -> list:
    """ZeRO 1-3: gradients reduce-scattered, axis by axis; parameters all-gathered before use in
    both passes (ZeRO-3) or the updated shards after the optimizer step (ZeRO-1/2).

    ZeRO-1 keeps the whole gradient and reduce-scatters it once a step (``grad``: Megatron-LM's
    distributed optimizer, torch's pipeline stage). ZeRO-2/3 keep only the shard, so every
    micro-batch's backward reduce-scatters (``reduce``): FSDP2 without
    ``set_requires_gradient_sync(False)``, torchtitan's choice (pytorch/pytorch#126166,
    pytorch/torchtitan#1710), and DeepSpeed's stage 2/3 gradient accumulation.

    Innermost axis first (NCCL's and FSDP's hybrid order, as ``hierarchical_all_reduce``): the
    whole buffer is reduce-scattered over the fast inner link and only the shard crosses the
    outer one; gathering mirrors it (the outer axis gathers the smallest piece)."""
    comm: list[Collective] = []
    buffer, grad_buffer = nbytes, grad_nbytes
    for ax in reversed(dp_axes):
        comm.append(Collective("grad" if z == 1 else "reduce", "reduce_scatter", ax, grad_buffer))
        if z == 3:  # parameters gathered before use, in both passes
            comm.append(Collective("fwd", "all_gather", ax, buffer))
            comm.append(Collective("bwd", "all_gather", ax, buffer))
        else:  # updated shards gathered after the optimizer step
            comm.append(Collective("opt", "all_gather", ax, buffer))
        buffer /= mesh_shape[ax]
        grad_buffer /= mesh_shape[ax]
    return comm


def _param_cost(
    numel: float,
    layout: Layout,
    mesh_shape: tuple[int, ...],
    settings: TrainingSettings,
    info: OperandInfo,
) -> tuple[list[Collective], Memory, float]:
    """A parameter's collectives (bucketed), its memory and the HBM bytes of its optimizer step."""
    dp_axes = [ax for ax, p in enumerate(layout) if p == GRAD_PARTIAL and mesh_shape[ax] > 1]
    nbytes, grad_nbytes = numel * settings.elem_bytes, numel * settings.grad_bytes
    # A parameter read by several operators (tied embeddings) has its gradient reduced once per
    # use: XLA's SPMD partitioner reduces each use's partial gradient where it is computed
    # (measured by `planner verify`); a framework that accumulates first pays less.
    # fixed: the settings'; auto: the layer's
    z = info.zero if settings.zero == AUTO else settings.zero
    if z == 0:
        comm = hierarchical_all_reduce("grad", dp_axes, grad_nbytes, mesh_shape)
    else:
        comm = _sharded_param_comm(z, dp_axes, nbytes, grad_nbytes, mesh_shape)
    if settings.bucket_bytes > 0:
        comm = [
            replace(
                c,
                count=bucket_share(
                    grad_nbytes if c.phase in ("grad", "reduce") else nbytes, settings.bucket_bytes
                ),
            )
            for c in comm
        ]
    if not info.counts_memory:
        return comm, Memory(), 0.0
    dp = math.prod(mesh_shape[ax] for ax in dp_axes)
    memory = Memory(
        params=nbytes / (dp if z >= 3 else 1),
        grads=grad_nbytes / (dp if z >= 2 else 1),
        optimizer=numel * settings.optimizer_bytes / (dp if z >= 1 else 1),
    )
    # read the gradient and the state, write the state and the weights
    updated = numel / (dp if z >= 1 else 1)
    step_bytes = updated * (
        settings.grad_bytes + 2 * settings.optimizer_bytes + settings.elem_bytes
    )
    return comm, memory, step_bytes


def output_layouts(op: Operator, strategy: Strategy) -> tuple[Layout, ...]:
    return tuple(operand_layout(o, strategy, output=True) for o in op.outputs)


def input_layouts(
    op: Operator, strategy: Strategy, inputs: tuple[OperandInfo, ...]
) -> tuple[Layout, ...]:
    return tuple(
        input_layout(op, slot, strategy, info.needs_grad) for slot, info in enumerate(inputs)
    )
