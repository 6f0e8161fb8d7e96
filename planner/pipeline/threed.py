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

from planner.cost.settings import RECOMPUTE, TrainingSettings
from planner.errors import InfeasibleError, SettingsError
from planner.search.exact import solve_exact
from planner.plans import FAILED
from planner.ir.graph import Graph
from planner.cluster.mesh import Mesh
from planner.cluster.profiles import MachineProfile
from planner.pipeline.layer_costs import layer_of, plan_valid, model_chain
from planner.pipeline.schedule import Evaluator, LayerChain, PipelinePlan, parse_schedule
from planner.pipeline.timeline import StageDetail, stage_details
from planner.pipeline.search import METHODS, given_cuts, stage_breakdown
from planner.cost.problem import Problem, build_problem
from planner.units import bytes_text
from planner.cost.strategy import Strategy

STAGE_FIELDS = ("first_layer", "end_layer", "forward_s", "backward_s", "recompute_s", "forward_comm_s",
                "backward_comm_s", "hidden_s", "send_s", "grad_sync_s", "params_bytes", "grads_bytes",
                "optimizer_bytes", "activations_bytes", "working_bytes", "tied_bytes")


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
    stage_details: tuple[StageDetail, ...] = ()  # the stage times and memory term by term
    tied_sync_s: float = 0.0  # all-reduce of a parameter kept on two stages, per step
    operator_layers: tuple[int | None, ...] = ()  # each operator's layer (None outside the layers)
    notes: tuple[str, ...] = ()  # what the plan leaves undone that its options asked for

    @property
    def status(self) -> str:
        return self.pipeline.status

    @property
    def found(self) -> bool:
        """Whether the search found a plan (``plans.PlanResult``)."""
        return self.status not in FAILED

    @property
    def step_time_s(self) -> float | None:
        """One iteration's predicted time; None without a plan (``plans.PlanResult``)."""
        return self.pipeline.iteration_time_s if self.found else None

    @property
    def memory_per_device_bytes(self) -> float:
        """The worst stage's memory per device (``plans.PlanResult``)."""
        return self.pipeline.max_memory_bytes

    @property
    def fits_memory(self) -> bool:
        return self.pipeline.fits_memory

    def summary_row(self, timings: bool = True) -> dict:
        """One flat CSV row: configuration, pipeline shape and headline figures."""
        pipe, settings = self.pipeline, self.settings
        row = {"model": self.model, "mesh": self.mesh, "device": self.device, "stages": pipe.stages,
               "stage_mesh": self.stage_mesh, "num_microbatches": pipe.num_microbatches,
               "micro_batch": pipe.micro_batch, "schedule": pipe.schedule, "method": pipe.method,
               "intra_method": self.intra_method, "intra_status": self.intra_status, "status": pipe.status,
               "iteration_time_s": pipe.iteration_time_s, "max_memory_bytes": pipe.max_memory_bytes,
               "fits_memory": pipe.fits_memory, "cuts": " ".join(map(str, pipe.cuts)),
               "recompute": settings.recompute, "zero": settings.zero,
               "sequence_parallel": settings.sequence_parallel}
        if timings:
            row["search_time_s"] = self.search_time_s
        return row

    def to_dict(self, timings: bool = True) -> dict:
        """The 3D plan JSON (schema ``planner-3d/2``, documented in the README)."""
        pipe, axes = self.pipeline, self.stage_mesh_names
        data = {
            "format": "planner-3d/2", "model": self.model, "mesh": self.mesh, "device": self.device,
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
            "tied_sync_s": self.tied_sync_s,
            "operators": [{"name": n, "kind": kind, "stage": k, "strategy": dict(zip(axes, s))}
                          for n, kind, k, s in self.operators],
        }
        for row, detail in zip(data["stages"], self.stage_details):
            row.update({name: getattr(detail, name) for name in STAGE_FIELDS})
        for row, layer in zip(data["operators"], self.operator_layers):
            row["layer"] = layer
        if self.notes:
            data["notes"] = list(self.notes)
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
    layers = max(layer_of(graph)) + 1
    outer = mesh.axes[0].size
    chunks = parse_schedule(schedule)[1]  # interleaved:v: every stage holds v chunks of >= 1 layer
    degrees = degrees or [p for p in divisors(outer) if p * chunks <= layers]
    _check_choices(degrees, counts, outer, layers, batch, cuts, chunks)
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
        least = min((row["max_memory_bytes"] for row in rows), default=None)
        need = f"the least of any candidate needs {bytes_text(least)} per device, the limit is " \
               f"{bytes_text(memory_limit)}; " if least is not None and memory_limit is not None else ""
        raise InfeasibleError("--memory: no pipeline degree, micro-batch count or memory-saving variant fits; "
                              f"{need}add devices or raise the memory limit")
    return replace(best, candidates=tuple(rows), search_time_s=time.perf_counter() - start)


def _check_choices(degrees, counts, outer: int, layers: int, batch: int, cuts, chunks: int = 1) -> None:
    for p in degrees:
        if outer % p or p > layers:
            raise SettingsError(f"--pp: {p} stages must divide the outermost mesh axis ({outer}) and be at most "
                                f"the number of layers ({layers})")
        if p * chunks > layers:
            raise SettingsError(f"--schedule: interleaved:{chunks} on {p} stages needs at least {chunks} layers "
                                f"per stage ({p * chunks} > {layers} layers); choose a smaller v or fewer stages")
    if not degrees:
        raise SettingsError(f"--schedule: interleaved:{chunks} leaves no pipeline degree: it needs at least "
                            f"{chunks} layers per stage ({layers} layers)")
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
    layer = layer_of(graph)
    ops = tuple((op.name, op.kind, bisect.bisect_right(pipe.cuts, layer[i]), tuple(strategies[op.name]))
                for i, op in enumerate(graph.operators))
    linear = [op for op in graph.operators if op.kind == "linear"]
    tp = tuple((axis.name, _most_common([strategies[op.name][k] for op in linear])) for k, axis in enumerate(sub.axes))
    tied_sync = Evaluator(chain, pipe.stages, pipe.schedule, None).tied_sync(pipe.cuts)
    return Plan3D(graph.name, mesh.spec, profile.name, pipe, sub.spec, settings, intra_method, status, tp, ops,
                  times, memory, memory_limit, stage_details=stage_details(chain, pipe), tied_sync_s=float(tied_sync),
                  operator_layers=tuple(op.layer for op in graph.operators))


def recost(load: Callable[[int], Graph], mesh: Mesh, profile: MachineProfile, batch: int, settings: TrainingSettings,
           memory_limit: float | None, stages: int, cuts: tuple[int, ...], num_microbatches: int, schedule: str,
           strategies: dict[str, Strategy], intra_method: str = "given") -> Plan3D:
    """Cost a fixed 3D plan (a plan JSON read back): same chain and evaluator as the search."""
    parse_schedule(schedule)  # a malformed schedule is refused before the model is built
    if batch % num_microbatches:
        raise SettingsError(f"--num-microbatches: {num_microbatches} does not divide the batch {batch}")
    sub = stage_mesh(mesh, stages)
    graph = load(batch // num_microbatches)
    if not plan_valid(graph, sub, strategies):
        raise SettingsError(f"--plan: field 'operators': the stage plan does not divide the micro-batch of "
                            f"{batch // num_microbatches}")
    chain = model_chain(load, batch, [num_microbatches], sub, profile, settings, strategies, mesh.axes[0])
    pipe = given_cuts(chain, stages, schedule, memory_limit, cuts)
    return assemble(graph, mesh, sub, profile, settings, chain, pipe, strategies, "GIVEN", memory_limit, intra_method)


def _most_common(values: list) -> object:
    return max(sorted(set(values), key=str), key=values.count) if values else None


def replicated_linears(result: Plan3D, tp: int) -> tuple[str, ...]:
    """A note when Megatron's pattern left linear layers whole on the tensor-parallel axis (tp
    divides none of their dims, e.g. 12 attention heads on tp 8): they run replicated there."""
    if tp <= 1 or "tp" not in result.stage_mesh_names:
        return ()
    axis = result.stage_mesh_names.index("tp")
    whole = [name for name, kind, _, strategy in result.operators if kind == "linear" and strategy[axis] is None]
    if not whole:
        return ()
    linears = sum(kind == "linear" for _, kind, _, _ in result.operators)
    return (f"--tp {tp}: {len(whole)} of {linears} linear layers (first {whole[0]}) are replicated on the "
            f"tensor-parallel axis: {tp} divides none of their split dims (heads, ffn); each tp rank "
            "computes them whole",)
