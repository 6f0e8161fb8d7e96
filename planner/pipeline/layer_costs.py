"""Layer chains of a fixed intra-operator plan: each layer's time per micro-batch (by term),
gradient sync, memory and the activation bytes it sends to the next stage, re-costed at every
micro-batch count (costs stay symbolic: nothing is measured). Operators outside layers join the
first and the last layer; an edge belongs to its consumer's layer."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

import numpy as np

from planner.cluster.mesh import Mesh, MeshAxis
from planner.cluster.profiles import MachineProfile
from planner.cost.collectives import PER_MICROBATCH
from planner.cost.operands import operand_infos, signature_ids
from planner.cost.operators import op_cost, output_layouts
from planner.cost.records import CostRecord, breakdown, seconds
from planner.cost.settings import INTEGER_BYTES, TrainingSettings
from planner.cost.strategy import REPLICATE, Strategy, divides
from planner.cost.terms import layer_sums
from planner.errors import SettingsError
from planner.ir.crossing import crossing_tensors
from planner.ir.graph import Graph
from planner.pipeline.schedule import LayerChain


def layer_of(graph: Graph) -> list[int]:
    """Per operator, its position in the layer chain: its layer counted from the first; operators
    outside layers join the first (before any layer) or the last (after)."""
    layers = [op.layer for op in graph.operators]
    known = [layer for layer in layers if layer is not None]
    if not known:
        raise SettingsError(f"--model: {graph.name} has no layers to pipeline")
    return list(graph.derived(("layer_of",), lambda: _positions(layers, min(known), max(known))))


def _positions(layers: list, first: int, last: int) -> tuple[int, ...]:
    out, seen = [], False
    for layer in layers:
        seen = seen or layer is not None
        out.append(layer - first if layer is not None else (0 if not seen else last - first))
    return tuple(out)


def _layer_arrays(records: list, mesh: Mesh, profile: MachineProfile) -> dict:
    """Per layer: time per micro-batch and its parts, gradient sync, static and activation memory
    (each distinct record's phases computed once)."""
    phases = {
        id(r): (
            _phase_seconds(r, mesh, profile, PER_MICROBATCH),
            _phase_seconds(r, mesh, profile, ("grad", "opt")),
            _time_parts(r, mesh, profile),
        )
        for r in {id(r): r for r in records}.values()
    }
    return {
        "time": np.array([phases[id(r)][0] for r in records]),
        "parts": np.array([phases[id(r)][2] for r in records]),
        "static_parts": np.array(
            [(r.memory.params, r.memory.grads, r.memory.optimizer) for r in records]
        ),
        "sync": np.array([phases[id(r)][1] for r in records]),
        "activation_memory": np.array([r.memory.activations for r in records]),
        "static_memory": np.array(
            [r.memory.params + r.memory.grads + r.memory.optimizer for r in records]
        ),
    }


def cost_layers(
    graph: Graph,
    mesh: Mesh,
    profile: MachineProfile,
    settings: TrainingSettings,
    strategies: dict[str, Strategy],
) -> dict[str, np.ndarray]:
    """Per-layer costs of a fixed intra-operator plan: time per micro-batch, gradient sync, memory,
    and the bytes per device of the activations leaving each layer (each tensor once per boundary,
    split over the stage's devices by ``send_split``). An edge belongs to its consumer's layer."""
    infos = operand_infos(graph, settings)
    layer = layer_of(graph)
    n = max(layer) + 1
    chosen = [strategies[op.name] for op in graph.operators]
    op_records, records = layer_sums(graph, mesh, profile, settings, chosen, layer, n)
    out_bytes = _crossing_bytes(graph, mesh, settings, chosen, layer, n)
    logits = np.zeros(n)
    for i, record in enumerate(op_records):  # the loss's saved softmax, a part of the activations
        if graph.operators[i].kind == "cross_entropy":
            logits[layer[i]] += record.memory.activations
    return {
        **_layer_arrays(records, mesh, profile),
        "logits_memory": logits,
        "out_bytes": out_bytes,
        "working_memory": _working_memory(
            graph, mesh, profile, settings, chosen, op_records, layer, n
        ),
        "tied": _tied_parameters(graph, mesh, profile, settings, chosen, infos, op_records, layer),
    }


def _crossing_bytes(
    graph: Graph, mesh: Mesh, settings: TrainingSettings, chosen, layer: list[int], n: int
) -> np.ndarray:
    """Per layer l, the bytes per device sent at a stage boundary after it: every tensor that
    crosses it (``planner.ir.crossing``: made at or before l, read after l; a tensor that skips
    stages is handed on at each boundary, as the runners send it), split by ``send_split``."""
    out = np.zeros(n)
    for boundary, sends in enumerate(_crossing_sends(graph, settings.elem_bytes, layer, n)):
        for i, k, nbytes in sends:
            layout = output_layouts(graph.operators[i], chosen[i])[k]
            out[boundary] += nbytes / send_split(layout, mesh)
    return out


def _crossing_sends(graph: Graph, elem_bytes: int, layer: list[int], n: int) -> list:
    """Per boundary, (producer op, output slot, whole bytes) of each tensor crossing it: facts of
    the graph alone, built once per graph (the search re-costs it under many plans)."""

    def build() -> list:
        made = {
            o.tensor: (i, k)
            for i, op in enumerate(graph.operators)
            for k, o in enumerate(op.outputs)
        }
        position = {op.name: layer[i] for i, op in enumerate(graph.operators)}
        sends = []
        for names in crossing_tensors(graph, position, n):
            tensors = [graph.tensor(name) for name in names]
            sends.append(
                [
                    (
                        *made[t.name],
                        math.prod(t.shape) * (INTEGER_BYTES if t.integer else elem_bytes),
                    )
                    for t in tensors
                ]
            )
        return sends

    return graph.derived(("crossing_sends", elem_bytes, n), build)


def _working_memory(
    graph: Graph,
    mesh: Mesh,
    profile: MachineProfile,
    settings: TrainingSettings,
    chosen,
    records,
    layer: list[int],
    n: int,
) -> np.ndarray:
    """Per layer, the transient bytes on top of what it keeps at its peak: under recompute, the
    activations its re-run materialises again (what it would keep without recompute less what it
    keeps: Megatron's working set of one layer); at the loss, the backward pass's buffers.
    The larger of the two, as they do not coexist."""
    working = _loss_backward_bytes(graph, records, chosen, layer, n, settings.loss_kernel)
    if settings.recompute == "none":
        return working
    plain = replace(settings, recompute="none", layer_recompute=())
    infos = operand_infos(graph, plain)
    rerun = np.zeros(n)
    kept: dict[tuple, float] = {}  # identical layers cost once
    for i, (op, signature) in enumerate(zip(graph.operators, signature_ids(graph, plain))):
        key = (signature, chosen[i])
        if key not in kept:
            kept[key] = op_cost(
                op, chosen[i], mesh, plain, infos[op.name], profile
            ).memory.activations
        # per operator, what the re-run makes again (an output the operator policy caches
        # though no backward reads it is kept, not re-made: never negative)
        rerun[layer[i]] += max(0.0, kept[key] - records[i].memory.activations)
    return np.maximum(working, rerun)


# The loss's backward buffers beyond its saved fp32 log-probabilities, counted in buffers of that
# size, per kernel (``TrainingSettings.loss_kernel``):
#   torch          2  nll_loss_backward's dense gradient and _log_softmax_backward_data's
#                     grad_input (PyTorch aten/src/ATen/native/{LossNLL,SoftMax}.cpp)
#   loss-parallel  3  on vocabulary-sharded logits (2, PyTorch's, otherwise, as torchtitan runs):
#                     zeros_like(log_probs), exp(log_probs) and their sum, alive together before
#                     the product (torchtitan/components/loss.py _LossParallelCrossEntropy and
#                     DTensor's torch/distributed/tensor/parallel/loss.py)
#   fused          0  megatron-core's VocabParallelCrossEntropy.backward writes the gradient into
#                     the saved softmax (megatron/core/tensor_parallel/cross_entropy.py)
LOSS_BACKWARD_BUFFERS = {"torch": 2, "loss-parallel": 3, "fused": 0}


def _loss_backward_bytes(
    graph: Graph, records, chosen, layer: list[int], n: int, loss_kernel: str
) -> np.ndarray:
    """Per layer, the loss's backward buffers beyond its saved softmax (a part of activations)."""
    out = np.zeros(n)
    for i, op in enumerate(graph.operators):
        if op.kind == "cross_entropy":
            sharded = bool(op.norm_dims & set(chosen[i]))  # the classes split over a mesh axis
            kernel = loss_kernel if sharded or loss_kernel != "loss-parallel" else "torch"
            out[layer[i]] += LOSS_BACKWARD_BUFFERS[kernel] * records[i].memory.activations
    return out


def _tied_parameters(
    graph: Graph,
    mesh: Mesh,
    profile: MachineProfile,
    settings: TrainingSettings,
    chosen,
    infos,
    records,
    layer: list[int],
) -> list[tuple[int, int, float, float]]:
    """Parameters read in two layers (the tied embedding, read by the LM head): (owner layer,
    reader layer, the reader's copy's static bytes, its gradient bytes)."""
    tied = []
    for i, slot, home in graph.derived(
        ("tied_reads", settings), lambda: _tied_reads(graph, infos, layer)
    ):
        op = graph.operators[i]
        own = tuple(
            replace(x, counts_memory=True) if j == slot else x for j, x in enumerate(infos[op.name])
        )
        copy, base = op_cost(op, chosen[i], mesh, settings, own, profile).memory, records[i].memory
        static = (
            copy.params + copy.grads + copy.optimizer - (base.params + base.grads + base.optimizer)
        )
        tied.append((home, layer[i], static, copy.grads - base.grads))
    return tied


def _tied_reads(graph: Graph, infos, layer: list[int]) -> tuple[tuple[int, int, int], ...]:
    """(operator, input slot, owner layer) of each parameter read outside the layer that keeps
    it."""
    owner = {
        op.inputs[slot].tensor: layer[i]
        for i, op in enumerate(graph.operators)
        for slot, info in enumerate(infos[op.name])
        if info.role == "param" and info.counts_memory
    }
    return tuple(
        (i, slot, owner.get(op.inputs[slot].tensor, layer[i]))
        for i, op in enumerate(graph.operators)
        for slot, info in enumerate(infos[op.name])
        if info.role == "param"
        and not info.counts_memory
        and owner.get(op.inputs[slot].tensor, layer[i]) != layer[i]
    )


def send_split(layout, mesh: Mesh) -> int:
    """How many devices share one stage-to-stage send: its shards, and on every axis where the
    tensor is replicated a scatter before the send and a gather after it (Megatron-LM's
    scatter/gather optimisation: each tensor-parallel rank sends 1/t; the gather runs on NVLink
    inside the receiving stage and is not charged)."""
    return math.prod(axis.size for axis, p in zip(mesh.axes, layout) if p >= 0 or p == REPLICATE)


def _phase_seconds(record, mesh: Mesh, profile: MachineProfile, phases: tuple[str, ...]) -> float:
    """Seconds of a record's per-micro-batch part (``fwd``/``bwd`` phases: the passes) or of its
    per-step part (``grad``/``opt``: gradient sync and optimizer step)."""
    comm = tuple(c for c in record.comm if c.phase in phases)
    if "fwd" in phases:
        part = CostRecord(
            comm=comm, fwd_s=record.fwd_s, bwd_s=record.bwd_s, hidden_s=record.hidden_s
        )
    else:
        part = CostRecord(comm=comm, opt_s=record.opt_s, hidden_sync_s=record.hidden_sync_s)
    return seconds(part, mesh, profile)


def _time_parts(record, mesh: Mesh, profile: MachineProfile) -> tuple[float, ...]:
    """A record's per-micro-batch seconds by term (``timeline.PARTS``); they add up to
    ``_phase_seconds(record, ..., PER_MICROBATCH)``."""
    weight = profile.compute_weight
    comm = [  # forward; backward with ZeRO-2/3's reduce-scatter of its gradients
        breakdown(
            CostRecord(comm=tuple(c for c in record.comm if c.phase in phases)), mesh, profile
        ).comm_s
        for phases in (("fwd",), ("bwd", "reduce"))
    ]
    return (
        weight * record.fwd_s,
        weight * (record.bwd_s - record.rerun_s),
        weight * record.rerun_s,
        comm[0],
        comm[1],
        weight * profile.overlap_weight * record.hidden_s,
    )


def model_chain(
    load: Callable[[int], Graph],
    batch: int,
    counts: list[int],
    mesh: Mesh,
    profile: MachineProfile,
    settings: TrainingSettings,
    strategies: dict[str, Strategy],
    link: MeshAxis,
    columns_cache: dict | None = None,
) -> LayerChain | None:
    """The layer chain of a fixed intra-operator plan re-costed at every micro-batch count.
    ``columns_cache``: a search's per-count costs by (micro-batch size, mesh, settings, plan)."""
    columns, kept = [], []
    cache = {} if columns_cache is None else columns_cache
    plan = tuple(strategies.values())
    for count in counts:
        graph = load(batch // count)
        # a split that no longer divides the micro-batch: skip
        if plan_valid(graph, mesh, strategies):
            key = (batch // count, mesh, profile, settings, plan)
            if key not in cache:
                cache[key] = cost_layers(graph, mesh, profile, settings, strategies)
            columns.append(cache[key])
            kept.append(count)
    if not columns:
        return None
    stack = lambda key: np.stack([col[key] for col in columns], axis=1)
    # the two copies' gradients are all-reduced between their stages over the pipeline link
    tied = tuple(
        (o, r, nbytes, 2 * link.latency + grad_bytes / link.bandwidth)
        for o, r, nbytes, grad_bytes in columns[0]["tied"]
    )
    return LayerChain(
        tuple(batch // c for c in kept),
        tuple(kept),
        stack("time"),
        stack("out_bytes"),
        stack("activation_memory"),
        columns[0]["static_memory"],
        stack("sync"),
        link.bandwidth,
        link.latency,
        working_memory=stack("working_memory"),
        tied=tied,
        parts=stack("parts"),
        static_parts=columns[0]["static_parts"],
        logits_memory=stack("logits_memory"),
    )


def plan_valid(graph: Graph, mesh: Mesh, strategies: dict[str, Strategy]) -> bool:
    """Whether every operator's strategy still divides its dims (a micro-batch split over more
    devices than it has samples does not)."""
    dims, ids = _distinct_dims(graph)
    # the layers repeat a few operators: each (dims, strategy) pair is checked once
    distinct = set(zip(ids, (strategies[op.name] for op in graph.operators)))
    return all(divides(dims[k], strategy, mesh) for k, strategy in distinct)


def _distinct_dims(graph: Graph) -> tuple[list[dict], tuple[int, ...]]:
    """The graph's distinct operator dims, and per operator the index of its own."""

    def build():
        index: dict = {}
        ids = tuple(index.setdefault(op.dims, len(index)) for op in graph.operators)
        return [dict(d) for d in index], ids

    return graph.derived(("distinct_dims",), build)
