"""3D plans: pipeline stages over the outermost mesh axis, intra-operator plans inside each stage.

For each pipeline degree p dividing the outermost axis (and at most the number of layers), the
stage sub-mesh is the mesh with that axis divided by p. The intra-operator plan is solved exactly
once per p on the stage sub-mesh at a reference micro-batch (M_ref = the smallest power of two
>= 2p that divides the batch), then that plan is re-costed at every candidate micro-batch size
b = batch / M, which gives the layer chain (costs stay symbolic: nothing is measured). Operators
outside layers (embedding, head, loss) join the first and the last layer. The pipeline planner
(CSIMD by default) picks cuts and M; the memory check is the schedule's (1F1B: stage k holds
min(p - k, M) micro-batches). When no plan fits, the stage is re-planned with full recompute, then
with ZeRO-1 on top; the best fitting total over p wins.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from planner.cost import TrainingSettings, edge_cost, input_layouts, op_cost, operand_infos, output_layouts, seconds, sum_records
from planner.errors import SettingsError
from planner.exact import solve_exact
from planner.graph import Graph
from planner.mesh import MachineProfile, Mesh, MeshAxis
from planner.pipeline import METHODS, LayerChain, PipelinePlan
from planner.problem import build_problem
from planner.strategy import Strategy, shard_factor

PER_MICROBATCH = ("fwd", "bwd")


@dataclass(frozen=True, slots=True)
class Plan3D:
    """The best 3D plan and the per-degree candidates that were compared."""

    pipeline: PipelinePlan
    stage_mesh: str
    settings: TrainingSettings
    intra_status: str
    tensor_parallel_dims: tuple[tuple[str, str | None], ...]  # per mesh axis: most common dim of linears
    candidates: tuple[dict, ...]
    search_time_s: float


def stage_mesh(mesh: Mesh, stages: int) -> Mesh:
    outer = mesh.axes[0]
    if outer.size % stages:
        raise SettingsError(f"--pipeline: {stages} stages do not divide mesh axis {outer.name} ({outer.size})")
    sizes = (outer.size // stages,) + mesh.shape[1:]
    axes = tuple(MeshAxis(a.name, s, a.bandwidth, a.latency) for a, s in zip(mesh.axes, sizes) if s > 1)
    return Mesh(axes or (MeshAxis(mesh.axes[-1].name, 1, mesh.axes[-1].bandwidth, mesh.axes[-1].latency),))


def _layer_of(graph: Graph) -> list[int]:
    layers = [op.layer for op in graph.operators]
    known = [layer for layer in layers if layer is not None]
    if not known:
        raise SettingsError(f"--model: {graph.name} has no layers to pipeline")
    first, last = min(known), max(known)
    out, seen = [], False
    for layer in layers:
        seen = seen or layer is not None
        out.append(layer - first if layer is not None else (0 if not seen else last - first))
    return out


def cost_layers(graph: Graph, mesh: Mesh, profile: MachineProfile, settings: TrainingSettings,
                strategies: dict[str, Strategy]) -> dict[str, np.ndarray]:
    """Per-layer costs of a fixed intra-operator plan: time per micro-batch, gradient sync, memory,
    and the bytes per device of the activations leaving each layer."""
    infos = operand_infos(graph, settings)
    layer = _layer_of(graph)
    n = max(layer) + 1
    per_layer: list[list] = [[] for _ in range(n)]
    producer = {o.tensor: (i, k) for i, op in enumerate(graph.operators) for k, o in enumerate(op.outputs)}
    outs = [output_layouts(op, strategies[op.name]) for op in graph.operators]
    out_bytes = np.zeros(n)
    for i, op in enumerate(graph.operators):
        per_layer[layer[i]].append(op_cost(op, strategies[op.name], mesh, settings, infos[op.name]))
        ins = input_layouts(op, strategies[op.name], infos[op.name])
        for slot, operand in enumerate(op.inputs):
            if operand.tensor not in producer:
                continue
            src, k = producer[operand.tensor]
            info = infos[op.name][slot]
            per_layer[layer[i]].append(edge_cost(info.shape, info.elem_bytes, outs[src][k], ins[slot], mesh.shape,
                                                 info.needs_grad))
            if layer[src] < layer[i]:
                numel = math.prod(info.shape) / shard_factor(outs[src][k], mesh.shape)
                out_bytes[layer[src]] += numel * info.elem_bytes
    records = [sum_records(r) for r in per_layer]
    return {
        "time": np.array([_phase_seconds(r, mesh, profile, PER_MICROBATCH) for r in records]),
        "sync": np.array([_phase_seconds(r, mesh, profile, ("grad", "opt")) for r in records]),
        "activation_memory": np.array([r.memory.activations for r in records]),
        "static_memory": np.array([r.memory.params + r.memory.grads + r.memory.optimizer for r in records]),
        "out_bytes": out_bytes,
    }


def _phase_seconds(record, mesh: Mesh, profile: MachineProfile, phases: tuple[str, ...]) -> float:
    comm = tuple(c for c in record.comm if c.phase in phases)
    flops = record.fwd_flops + record.bwd_flops if "fwd" in phases else 0.0
    return seconds(replace(record, fwd_flops=flops, bwd_flops=0.0, comm=comm), mesh, profile)


def model_chain(load: Callable[[int], Graph], batch: int, counts: list[int], mesh: Mesh, profile: MachineProfile,
                settings: TrainingSettings, strategies: dict[str, Strategy], link: MeshAxis) -> LayerChain | None:
    """The layer chain of a fixed intra-operator plan re-costed at every micro-batch count."""
    columns, kept = [], []
    for count in counts:
        graph = load(batch // count)
        if _plan_valid(graph, mesh, strategies):  # a split that no longer divides the micro-batch: skip
            columns.append(cost_layers(graph, mesh, profile, settings, strategies))
            kept.append(count)
    if not columns:
        return None
    stack = lambda key: np.stack([col[key] for col in columns], axis=1)
    return LayerChain(tuple(batch // c for c in kept), tuple(kept), stack("time"), stack("out_bytes"),
                      stack("activation_memory"), columns[0]["static_memory"], columns[0]["sync"],
                      link.bandwidth, link.latency)


def _plan_valid(graph: Graph, mesh: Mesh, strategies: dict[str, Strategy]) -> bool:
    for op in graph.operators:
        sizes = op.sizes
        factor: dict[str, int] = {}
        for axis, dim in zip(mesh.axes, strategies[op.name]):
            if dim is not None:
                factor[dim] = factor.get(dim, 1) * axis.size
        if any(sizes[d] % f for d, f in factor.items()):
            return False
    return True


def plan_pipeline(load: Callable[[int], Graph], mesh: Mesh, profile: MachineProfile, batch: int,
                  settings: TrainingSettings, memory_limit: float | None, schedule: str = "1f1b",
                  method: str = "csimd", degrees: list[int] | None = None,
                  progress: Callable[[int, int, str], None] | None = None) -> Plan3D:
    """Search the pipeline degree, the intra-operator plan per stage, the cuts and the micro-batch count."""
    start = time.perf_counter()
    layers = max(_layer_of(load(batch))) + 1
    outer = mesh.axes[0].size
    degrees = degrees or [p for p in range(1, outer + 1) if outer % p == 0 and p <= layers and p & (p - 1) == 0]
    counts = [c for c in range(1, batch + 1) if batch % c == 0 and c & (c - 1) == 0]
    best, rows = None, []
    for done, p in enumerate(degrees):
        if progress:
            progress(done, len(degrees), "pipeline degrees")
        sub = stage_mesh(mesh, p)
        for variant in _variants(settings):
            found = _plan_degree(load, mesh, sub, profile, batch, variant, memory_limit, schedule, method, p, counts)
            if found is None:
                continue
            pipe, status, tp = found
            rows.append({"stages": p, "stage_mesh": sub.spec, "recompute": variant.recompute, "zero": variant.zero,
                         "num_microbatches": pipe.num_microbatches, "iteration_time_s": pipe.iteration_time_s,
                         "max_memory_bytes": pipe.max_memory_bytes, "fits_memory": pipe.fits_memory})
            if pipe.fits_memory:
                if best is None or pipe.iteration_time_s < best.pipeline.iteration_time_s:
                    best = Plan3D(pipe, sub.spec, variant, status, tp, (), 0.0)
                break
    if progress:
        progress(len(degrees), len(degrees), "pipeline degrees")
    if best is None:
        raise SettingsError("--memory: no pipeline degree, micro-batch count or memory-saving variant fits; "
                            "add devices or raise the memory limit")
    return replace(best, candidates=tuple(rows), search_time_s=time.perf_counter() - start)


def _variants(settings: TrainingSettings) -> list[TrainingSettings]:
    out = [settings]
    if not settings.recompute:
        out.append(replace(settings, recompute=True))
    if settings.zero < 1:
        out.append(replace(out[-1], zero=1))
    return out


def stage_chain(load, mesh, sub, profile, batch, settings, p, counts):
    """Solve the intra-operator plan on the stage sub-mesh at the reference micro-batch; its chain."""
    reference = next((c for c in counts if c >= 2 * p), counts[-1])
    graph = load(batch // reference)
    problem = build_problem(graph, sub, profile, settings)
    result, _ = solve_exact(problem, None)
    strategies = {t.op.name: t.strategies[c] for t, c in zip(problem.ops, result.choice)}
    chain = model_chain(load, batch, counts, sub, profile, settings, strategies, mesh.axes[0])
    return None if chain is None else (chain, result.status, strategies, graph)


def _plan_degree(load, mesh, sub, profile, batch, settings, memory_limit, schedule, method, p, counts):
    found = stage_chain(load, mesh, sub, profile, batch, settings, p, counts)
    if found is None or p > found[0].num_layers:
        return None
    chain, status, strategies, graph = found
    pipe = METHODS[method](chain, p, schedule, memory_limit)
    if pipe.status != "OK" and not pipe.fits_memory and math.isinf(pipe.iteration_time_s):
        pipe = METHODS[method](chain, p, schedule, None)  # report the unconstrained plan as not fitting
        pipe = replace(pipe, fits_memory=memory_limit is None or pipe.max_memory_bytes <= memory_limit,
                       status="INFEASIBLE")
    linear = [op for op in graph.operators if op.kind == "linear"]
    tp = tuple((axis.name, _most_common([strategies[op.name][k] for op in linear])) for k, axis in enumerate(sub.axes))
    return pipe, status, tp


def _most_common(values: list) -> object:
    return max(sorted(set(values), key=str), key=values.count) if values else None
