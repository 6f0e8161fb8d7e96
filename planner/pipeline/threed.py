"""3D plans: pipeline stages over the outermost mesh axis, intra-operator plans inside each stage.

For each pipeline degree p dividing the outermost axis (every divisor, at most the number of
layers), the stage sub-mesh is the mesh with that axis divided by p. The intra-operator plan is
solved once per p on the stage sub-mesh (by the exact search, or by the method the caller
passes) at a reference micro-batch count M_ref = the smallest divisor of the batch >= 2p, then
that plan is re-costed at every candidate micro-batch count M (every divisor of the batch for
which the plan still divides the micro-batch b = batch / M), which gives the layer chain (costs
stay symbolic: nothing is measured). Operators outside layers (embedding, head, loss) join the
first and the last layer. The cut search (CSIMD by default) picks cuts and M; the memory check is
the schedule's (1F1B: stage k holds min(p - k, M) micro-batches). Stages need not hold equal
layer counts: the cut search places every cut, and the ``even`` method gives stage k the layers
round(k L / p) .. round((k+1) L / p) - 1 (96 layers on 35 stages: 26 stages of 3 layers and 9
of 2). When no plan fits, the stage is re-planned with sequence parallelism, then selective and
full recompute, then ZeRO-1 on top (unless ``escalate`` is off); the best fitting total over p wins.

The micro-batch size b in a 3D plan counts the samples of one micro-batch over the whole stage
(all its data-parallel replicas); Megatron's per-replica micro-batch is b / dp.
"""

from __future__ import annotations

import bisect
import functools
import math
import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from planner.cost.operators import op_cost, operand_infos, output_layouts, signature_ids
from planner.cost.records import CostRecord, seconds, sum_records
from planner.cost.settings import RECOMPUTE, TrainingSettings
from planner.cost.terms import plan_terms
from planner.errors import InfeasibleError, SettingsError
from planner.search.exact import solve_exact
from planner.ir.graph import Graph
from planner.cluster.mesh import Mesh, MeshAxis
from planner.cluster.profiles import MachineProfile
from planner.pipeline.schedule import LayerChain, PipelinePlan
from planner.pipeline.search import METHODS, given_cuts, stage_breakdown
from planner.cost.problem import Problem, build_problem
from planner.cost.strategy import REPLICATE, Strategy, divides

PER_MICROBATCH = ("fwd", "bwd")


StagePlanner = Callable[[Problem], tuple[tuple[Strategy, ...], str]]  # strategies (problem order), status


@dataclass(frozen=True, slots=True)
class Plan3D:
    """A 3D plan: the pipeline (cuts, micro-batches, schedule), the stage plan, time and memory per stage."""

    model: str
    mesh: str
    device: str
    pipeline: PipelinePlan
    stage_mesh: str
    settings: TrainingSettings
    intra_method: str
    intra_status: str
    tensor_parallel_dims: tuple[tuple[str, str | None], ...]  # per mesh axis: most common dim of linears
    operators: tuple[tuple[str, str, int, tuple[str | None, ...]], ...]  # (name, kind, stage, dim per stage-mesh axis)
    stage_times_s: tuple[float, ...]  # per micro-batch, forward + backward + send
    stage_memory_bytes: tuple[float, ...]
    memory_limit_bytes: float | None
    candidates: tuple[dict, ...] = ()
    search_time_s: float = 0.0

    @property
    def status(self) -> str:
        return self.pipeline.status

    def to_dict(self, timings: bool = True) -> dict:
        """The 3D plan JSON (schema ``planner-3d/1``, documented in the README)."""
        pipe, axes = self.pipeline, self.stage_mesh_names
        data = {
            "format": "planner-3d/1", "model": self.model, "mesh": self.mesh, "device": self.device,
            "status": pipe.status, "intra_method": self.intra_method, "intra_status": self.intra_status,
            "iteration_time_s": pipe.iteration_time_s, "bottleneck_s": pipe.bottleneck_s,
            "max_memory_bytes": pipe.max_memory_bytes, "memory_limit_bytes": self.memory_limit_bytes,
            "fits_memory": pipe.fits_memory,
            "pipeline": {"stages": pipe.stages, "cuts": list(pipe.cuts), "num_microbatches": pipe.num_microbatches,
                         "micro_batch": pipe.micro_batch, "schedule": pipe.schedule, "method": pipe.method,
                         "stage_mesh": self.stage_mesh},
            "settings": self.settings.to_dict(),
            "stages": [{"stage": k, "time_per_microbatch_s": t, "memory_bytes": m}
                       for k, (t, m) in enumerate(zip(self.stage_times_s, self.stage_memory_bytes))],
            "operators": [{"name": n, "kind": kind, "stage": k, "strategy": dict(zip(axes, s))}
                          for n, kind, k, s in self.operators],
        }
        if timings:
            data["search_time_s"] = self.search_time_s
        return data

    @property
    def stage_mesh_names(self) -> tuple[str, ...]:
        return tuple(part.split("=")[0] for part in self.stage_mesh.split(","))


def stage_mesh(mesh: Mesh, stages: int) -> Mesh:
    outer = mesh.axes[0]
    if outer.size % stages:
        raise SettingsError(f"--pipeline: {stages} stages do not divide mesh axis {outer.name} ({outer.size})")
    return mesh.sub_mesh((outer.size // stages,) + mesh.shape[1:])


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
    and the bytes per device of the activations leaving each layer (each tensor once per boundary,
    split over the stage's devices by ``_send_split``). An edge belongs to its consumer's layer."""
    infos = operand_infos(graph, settings)
    layer = _layer_of(graph)
    n = max(layer) + 1
    chosen = [strategies[op.name] for op in graph.operators]
    terms = plan_terms(graph, mesh, profile, settings, chosen)
    per_layer: list[list] = [[] for _ in range(n)]
    for i, record in enumerate(terms.ops):
        per_layer[layer[i]].append(record)
    out_bytes, sent = np.zeros(n), set()
    for src, dst, slot, record in terms.edges:
        per_layer[layer[dst]].append(record)
        operand = graph.operators[dst].inputs[slot]
        if layer[src] < layer[dst] and operand.tensor not in sent:  # sent once per boundary, not per consumer
            sent.add(operand.tensor)
            info = infos[graph.operators[dst].name][slot]
            k = next(k for k, o in enumerate(graph.operators[src].outputs) if o.tensor == operand.tensor)
            layout = output_layouts(graph.operators[src], chosen[src])[k]
            out_bytes[layer[src]] += math.prod(info.shape) * info.elem_bytes / _send_split(layout, mesh)
    summed: dict[tuple[int, ...], CostRecord] = {}  # identical layers hold the same (cached) term objects
    records = []
    for layer_terms in per_layer:
        key = tuple(map(id, layer_terms))
        if key not in summed:
            summed[key] = sum_records(layer_terms)
        records.append(summed[key])
    phases = {id(r): (_phase_seconds(r, mesh, profile, PER_MICROBATCH),
                      _phase_seconds(r, mesh, profile, ("grad", "opt"))) for r in summed.values()}
    return {
        "time": np.array([phases[id(r)][0] for r in records]),
        "sync": np.array([phases[id(r)][1] for r in records]),
        "activation_memory": np.array([r.memory.activations for r in records]),
        "static_memory": np.array([r.memory.params + r.memory.grads + r.memory.optimizer for r in records]),
        "out_bytes": out_bytes,
        "working_memory": _working_memory(graph, mesh, profile, settings, chosen, terms.ops, layer, n),
        "tied": _tied_parameters(graph, mesh, profile, settings, chosen, infos, terms.ops, layer),
    }


def _working_memory(graph: Graph, mesh: Mesh, profile: MachineProfile, settings: TrainingSettings, chosen,
                    records, layer: list[int], n: int) -> np.ndarray:
    """Per layer, the activations its re-run materialises again under recompute (what it would
    keep without recompute less what it keeps): Megatron's working set of one layer."""
    working = np.zeros(n)
    if settings.recompute == "none":
        return working
    plain = replace(settings, recompute="none")
    infos = operand_infos(graph, plain)
    kept: dict[tuple, float] = {}  # identical layers cost once
    for i, (op, signature) in enumerate(zip(graph.operators, signature_ids(graph, plain))):
        key = (signature, chosen[i])
        if key not in kept:
            kept[key] = op_cost(op, chosen[i], mesh, plain, infos[op.name], profile).memory.activations
        working[layer[i]] += kept[key] - records[i].memory.activations
    return working


def _tied_parameters(graph: Graph, mesh: Mesh, profile: MachineProfile, settings: TrainingSettings, chosen, infos,
                     records, layer: list[int]) -> list[tuple[int, int, float, float]]:
    """Parameters read in two layers (the tied embedding, read by the LM head): (owner layer,
    reader layer, the reader's copy's static bytes, its gradient bytes)."""
    tied = []
    for i, slot, home in graph.derived(("tied_reads", settings), lambda: _tied_reads(graph, infos, layer)):
        op = graph.operators[i]
        own = tuple(replace(x, counts_memory=True) if j == slot else x for j, x in enumerate(infos[op.name]))
        copy, base = op_cost(op, chosen[i], mesh, settings, own, profile).memory, records[i].memory
        static = copy.params + copy.grads + copy.optimizer - (base.params + base.grads + base.optimizer)
        tied.append((home, layer[i], static, copy.grads - base.grads))
    return tied


def _tied_reads(graph: Graph, infos, layer: list[int]) -> tuple[tuple[int, int, int], ...]:
    """(operator, input slot, owner layer) of each parameter read outside the layer that keeps it."""
    owner = {op.inputs[slot].tensor: layer[i] for i, op in enumerate(graph.operators)
             for slot, info in enumerate(infos[op.name]) if info.role == "param" and info.counts_memory}
    return tuple((i, slot, owner.get(op.inputs[slot].tensor, layer[i])) for i, op in enumerate(graph.operators)
                 for slot, info in enumerate(infos[op.name])
                 if info.role == "param" and not info.counts_memory
                 and owner.get(op.inputs[slot].tensor, layer[i]) != layer[i])


def _send_split(layout, mesh: Mesh) -> int:
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
        part = CostRecord(comm=comm, fwd_s=record.fwd_s, bwd_s=record.bwd_s, hidden_s=record.hidden_s)
    else:
        part = CostRecord(comm=comm, opt_s=record.opt_s, hidden_sync_s=record.hidden_sync_s)
    return seconds(part, mesh, profile)


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
    # the two copies' gradients are all-reduced between their stages over the pipeline link
    tied = tuple((o, r, nbytes, 2 * link.latency + grad_bytes / link.bandwidth)
                 for o, r, nbytes, grad_bytes in columns[0]["tied"])
    return LayerChain(tuple(batch // c for c in kept), tuple(kept), stack("time"), stack("out_bytes"),
                      stack("activation_memory"), columns[0]["static_memory"], columns[0]["sync"],
                      link.bandwidth, link.latency, working_memory=stack("working_memory"), tied=tied)


def _plan_valid(graph: Graph, mesh: Mesh, strategies: dict[str, Strategy]) -> bool:
    distinct = {(op.dims, strategies[op.name]) for op in graph.operators}  # the layers repeat a few operators
    return all(divides(dict(dims), strategy, mesh) for dims, strategy in distinct)


def exact_stage_plan(problem: Problem) -> tuple[tuple[Strategy, ...], str]:
    """The default stage planner: the exact intra-operator search without a memory limit."""
    result, _ = solve_exact(problem, None)
    return tuple(t.strategies[c] for t, c in zip(problem.ops, result.choice)), result.status


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_pipeline(load: Callable[[int], Graph], mesh: Mesh, profile: MachineProfile, batch: int,
                  settings: TrainingSettings, memory_limit: float | None, schedule: str = "1f1b",
                  method: str = "csimd", degrees: list[int] | None = None, counts: list[int] | None = None,
                  stage_planner: StagePlanner = exact_stage_plan, intra_method: str = "exact",
                  cuts: tuple[int, ...] | None = None, escalate: bool = True, fit_required: bool = True,
                  progress: Callable[[int, int, str], None] | None = None) -> Plan3D:
    """Search the pipeline degree, the intra-operator plan per stage, the cuts and the micro-batch count.

    ``degrees``/``counts`` restrict the search (default: every divisor); ``cuts`` fixes the stage
    boundaries (one degree only); ``escalate`` adds recompute and ZeRO-1 when nothing fits.
    Raises ``InfeasibleError`` when no candidate fits the memory limit, unless ``fit_required`` is
    off: then the first candidate is returned, marked as not fitting."""
    start = time.perf_counter()
    load = functools.lru_cache(maxsize=None)(load)  # each micro-batch size's graph is built once per search
    graph = load(batch)
    layers = max(_layer_of(graph)) + 1
    outer = mesh.axes[0].size
    degrees = degrees or [p for p in divisors(outer) if p <= layers]
    _check_choices(degrees, counts, outer, layers, batch, cuts)
    counts = counts or divisors(batch)
    best, first, rows = None, None, []
    for done, p in enumerate(degrees):
        if progress:
            progress(done, len(degrees), "pipeline degrees")
        sub = stage_mesh(mesh, p)
        for variant in (_variants(settings, sub) if escalate else [settings]):
            found = _plan_degree(load, mesh, sub, profile, batch, variant, memory_limit, schedule, method, p, counts,
                                 stage_planner, cuts)
            if found is None:
                continue
            candidate = replace(found, intra_method=intra_method)
            pipe = candidate.pipeline
            first = first or candidate
            rows.append({"stages": p, "stage_mesh": sub.spec, "sequence_parallel": variant.sequence_parallel,
                         "recompute": variant.recompute, "zero": variant.zero,
                         "num_microbatches": pipe.num_microbatches, "iteration_time_s": pipe.iteration_time_s,
                         "max_memory_bytes": pipe.max_memory_bytes, "fits_memory": pipe.fits_memory})
            if pipe.fits_memory:
                if best is None or pipe.iteration_time_s < best.pipeline.iteration_time_s:
                    best = candidate
                break
    if progress:
        progress(len(degrees), len(degrees), "pipeline degrees")
    if best is None and first is not None and not fit_required:
        best = first
    if best is None:
        raise InfeasibleError("--memory: no pipeline degree, micro-batch count or memory-saving variant fits; "
                              "add devices or raise the memory limit")
    return replace(best, candidates=tuple(rows), search_time_s=time.perf_counter() - start)


def _check_choices(degrees, counts, outer: int, layers: int, batch: int, cuts) -> None:
    for p in degrees:
        if outer % p or p > layers:
            raise SettingsError(f"--pp: {p} stages must divide the outermost mesh axis ({outer}) and be at most "
                                f"the number of layers ({layers})")
    for count in counts or ():
        if batch % count:
            raise SettingsError(f"--num-microbatches: {count} does not divide the batch {batch}")
    if cuts is not None and len(degrees) != 1:
        raise SettingsError("--cuts: fixed cuts need one pipeline degree (--pp)")


def _variants(settings: TrainingSettings, stage: Mesh) -> list[TrainingSettings]:
    """The memory-saving escalation, cheapest first: sequence parallelism (when the stage mesh can
    split operators), selective recompute, full recompute, then ZeRO-1 on top."""
    out = [settings]
    if not settings.sequence_parallel and stage.num_devices > 1:
        out.append(replace(settings, sequence_parallel=True))
    for recompute in ("selective", "full"):
        if RECOMPUTE.index(settings.recompute) < RECOMPUTE.index(recompute):
            out.append(replace(out[-1], recompute=recompute))
    if settings.zero < 1:
        out.append(replace(out[-1], zero=1))
    return out


def stage_chain(load, mesh, sub, profile, batch, settings, p, counts, stage_planner: StagePlanner = exact_stage_plan):
    """Plan the stage sub-mesh at the reference micro-batch count; the plan's layer chain."""
    reference = next((c for c in counts if c >= 2 * p), counts[-1])
    graph = load(batch // reference)
    problem = build_problem(graph, sub, profile, settings)
    chosen, status = stage_planner(problem)
    strategies = {t.op.name: s for t, s in zip(problem.ops, chosen)}
    chain = model_chain(load, batch, counts, sub, profile, settings, strategies, mesh.axes[0])
    return None if chain is None else (chain, status, strategies, graph)


def _plan_degree(load, mesh, sub, profile, batch, settings, memory_limit, schedule, method, p, counts, stage_planner,
                 cuts) -> Plan3D | None:
    found = stage_chain(load, mesh, sub, profile, batch, settings, p, counts, stage_planner)
    if found is None or p > found[0].num_layers:
        return None
    chain, status, strategies, graph = found
    search = (lambda limit: given_cuts(chain, p, schedule, limit, cuts)) if cuts is not None else \
        (lambda limit: METHODS[method](chain, p, schedule, limit))
    pipe = search(memory_limit)
    if pipe.status != "OK" and not pipe.fits_memory and math.isinf(pipe.iteration_time_s):
        pipe = search(None)  # report the unconstrained plan as not fitting
        pipe = replace(pipe, fits_memory=memory_limit is None or pipe.max_memory_bytes <= memory_limit,
                       status="INFEASIBLE")
    return assemble(graph, mesh, sub, profile, settings, chain, pipe, strategies, status, memory_limit)


def assemble(graph: Graph, mesh: Mesh, sub: Mesh, profile: MachineProfile, settings: TrainingSettings,
             chain: LayerChain, pipe: PipelinePlan, strategies: dict[str, Strategy], status: str,
             memory_limit: float | None, intra_method: str = "exact") -> Plan3D:
    """A Plan3D from a costed pipeline: per-stage time and memory, each operator's stage and strategy."""
    times, memory = (tuple(float(x) for x in values) for values in stage_breakdown(chain, pipe))
    layer = _layer_of(graph)
    ops = tuple((op.name, op.kind, bisect.bisect_right(pipe.cuts, layer[i]), tuple(strategies[op.name]))
                for i, op in enumerate(graph.operators))
    linear = [op for op in graph.operators if op.kind == "linear"]
    tp = tuple((axis.name, _most_common([strategies[op.name][k] for op in linear])) for k, axis in enumerate(sub.axes))
    return Plan3D(graph.name, mesh.spec, profile.name, pipe, sub.spec, settings, intra_method, status, tp, ops,
                  times, memory, memory_limit)


def recost(load: Callable[[int], Graph], mesh: Mesh, profile: MachineProfile, batch: int, settings: TrainingSettings,
           memory_limit: float | None, stages: int, cuts: tuple[int, ...], num_microbatches: int, schedule: str,
           strategies: dict[str, Strategy], intra_method: str = "given") -> Plan3D:
    """Cost a fixed 3D plan (a plan JSON read back): same chain and evaluator as the search."""
    if batch % num_microbatches:
        raise SettingsError(f"num_microbatches: {num_microbatches} does not divide the batch {batch}")
    sub = stage_mesh(mesh, stages)
    graph = load(batch // num_microbatches)
    if not _plan_valid(graph, sub, strategies):
        raise SettingsError(f"operators: the stage plan does not divide the micro-batch of {batch // num_microbatches}")
    chain = model_chain(load, batch, [num_microbatches], sub, profile, settings, strategies, mesh.axes[0])
    pipe = given_cuts(chain, stages, schedule, memory_limit, cuts)
    return assemble(graph, mesh, sub, profile, settings, chain, pipe, strategies, "GIVEN", memory_limit, intra_method)


def _most_common(values: list) -> object:
    return max(sorted(set(values), key=str), key=values.count) if values else None
