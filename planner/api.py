"""The public Python API: plan, evaluate and compare models on a cluster.

    from planner import plan
    result = plan("gpt2-small", mesh="2x4", device="a100-80g")
    print(result.estimated_step_time_s, result.status)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from planner.cost.settings import AUTO, TrainingSettings
from planner.errors import InfeasibleError, PlannerError, SettingsError
from planner.ir.graph import Graph
from planner.search.baselines import data_parallel, drec_cost, greedy, megatron
from planner.search.sapp import sapp
from planner.cluster.mesh import Mesh, parse_mesh
from planner.cluster.profiles import DEFAULT_HARDWARE_CSV, MachineProfile, get_profile
from planner.plans import Plan, failed, pipeline_fields, make_plan, strategies_from_choice, strategies_from_mapping
from planner.cost.problem import Problem, build_problem
from planner.search.layer_modes import refuse_auto_without_layers
from planner.search.exact import solve_exact
from planner.search.reduce import Progress
from planner.search.restrict import pinned
from planner.search.solver import program_size
from planner.search.whole import MAX_WHOLE_PROGRAM
from planner.search.solver import solve
from planner.pipeline import threed
from planner.pipeline.search import METHODS as PIPELINE_METHODS
from planner.pipeline.threed import Plan3D
from planner.zoo import load_model

HEURISTICS = {"sapp": sapp, "drec-cost": drec_cost, "dp": data_parallel, "zero": data_parallel, "megatron": megatron,
              "greedy": greedy}
METHODS = ("exact", "whole") + tuple(HEURISTICS)
REPORT_SECONDS_PER_OP = 1.3e-5  # the plan report: measured 0.9-1.3 s per 100k operators (make_plan)


@dataclass(frozen=True, slots=True)
class Cluster:
    """A mesh on a machine profile, with the per-device memory limit (bytes, None: unlimited)."""

    mesh: Mesh
    profile: MachineProfile
    memory_limit: float | None


def make_cluster(mesh: str | Mesh | Cluster, device: str | MachineProfile = "a100-80g", memory: float | None = None,
                 devices: int | None = None, hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV) -> Cluster:
    """A mesh spec (``"2x4"``, ``"node=4,gpu=8"``) or ``Mesh`` on a device, with the memory limit
    (bytes; None: the device's, inf: none). A ``Cluster`` is returned as it is: its device and
    memory limit are its own, so another ``device``, a ``memory`` or ``devices`` beside it is refused."""
    if isinstance(mesh, Cluster):
        return _given_cluster(mesh, device, memory, devices)
    profile = device if isinstance(device, MachineProfile) else get_profile(device, hardware_csv)
    mesh_obj = mesh if isinstance(mesh, Mesh) else parse_mesh(str(mesh), profile, devices)
    if memory is not None and (not isinstance(memory, (int, float)) or math.isnan(memory) or memory <= 0):
        raise SettingsError(f"--memory: must be a positive number of bytes (or inf for no limit), got {memory!r}")
    if memory is None:
        limit = None if profile.name == "symbolic" else profile.memory_bytes
    else:
        limit = None if math.isinf(memory) else float(memory)
    return Cluster(mesh_obj, profile, limit)


def _given_cluster(cluster: Cluster, device, memory, devices) -> Cluster:
    if memory is not None or devices is not None:
        raise SettingsError(f"{'memory' if memory is not None else 'devices'}: the Cluster has its own; "
                            "give it to make_cluster instead")
    if device not in ("a100-80g", cluster.profile.name, cluster.profile):
        raise SettingsError(f"device: the Cluster is on {cluster.profile.name}, not {getattr(device, 'name', device)}")
    return cluster


def resolve_model(model: str | Graph, batch: int | None = None, seq: int | None = None) -> Graph:
    if isinstance(model, Graph):
        return model
    if isinstance(model, str) and model.endswith(".json"):
        from planner.ir.graph_json import load_graph
        return load_graph(model)
    return load_model(model, batch, seq)


def make_problem(model: str | Graph, cluster: Cluster, settings: TrainingSettings | None = None,
                 batch: int | None = None, seq: int | None = None) -> Problem:
    return build_problem(resolve_model(model, batch, seq), cluster.mesh, cluster.profile, settings or TrainingSettings())


def plan(model: str | Graph, mesh: str | Mesh | Cluster = "8", device: str | MachineProfile = "a100-80g", *,
         method: str = "exact", batch: int | None = None, seq: int | None = None, memory: float | None = None,
         settings: TrainingSettings | None = None, time_limit_s: float = 60.0, seed: int = 0,
         hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV, jobs: int = 1, progress: Progress | None = None,
         fixed: Mapping[str, Mapping[str, str | None]] | None = None) -> Plan:
    """Plan a model on a cluster with one search method (see ``METHODS``).

    ``time_limit_s`` counts from this call: loading the model, costing, the search and the plan
    report; ``search_time_s`` of the result counts costing and search only. ``fixed={op: {mesh
    axis: dim or None}}`` pins those operators to the given strategies (an axis left out
    replicates); the exact methods then find the best plan of the rest (``search.restrict``)."""
    begun = time.perf_counter()
    cluster = make_cluster(mesh, device, memory, hardware_csv=hardware_csv)
    graph = resolve_model(model, batch, seq)
    start = time.perf_counter()  # search time: costing every strategy and edge, then the search
    problem = make_problem(graph, cluster, settings)
    if fixed:
        problem = _pin(problem, fixed, method)
    # the plan report takes time too
    report_s = REPORT_SECONDS_PER_OP * len(problem.ops)
    remaining = max(0.0, time_limit_s - (time.perf_counter() - begun) - report_s)
    result = plan_problem(problem, cluster.memory_limit, method, remaining, seed, jobs, progress)
    return replace(result, search_time_s=time.perf_counter() - start)


def _pin(problem: Problem, fixed: Mapping[str, Mapping[str, str | None]], method: str) -> Problem:
    """The problem with the ``fixed`` operators pinned; only the exact methods honour a pin, and
    not under a per-layer ``auto`` (its variants are rebuilt from the graph)."""
    if method not in ("exact", "whole"):
        raise SettingsError(f"fixed: only the exact methods (exact, whole) search around pinned operators, "
                            f"not method {method!r}")
    if AUTO in (problem.settings.recompute, problem.settings.zero):
        raise SettingsError("fixed: pinned operators with recompute or zero 'auto' are not supported; "
                            "give fixed settings")
    return pinned(problem, fixed)


def plan_problem(problem: Problem, memory_limit: float | None, method: str = "exact", time_limit_s: float = 60.0,
                 seed: int = 0, jobs: int = 1, progress: Progress | None = None) -> Plan:
    """Search a plan for a built problem with one method (see ``METHODS``)."""
    start = time.perf_counter()
    refuse_auto_without_layers(problem)
    if method == "exact" or (method == "whole" and AUTO not in (problem.settings.recompute, problem.settings.zero)):
        return _search(problem, memory_limit, method, time_limit_s, seed, jobs, progress, start)
    for option, value in (("recompute", problem.settings.recompute), ("zero", problem.settings.zero)):
        if value == AUTO:
            raise SettingsError(f"--{option} auto: only --method exact chooses it per layer; give a fixed "
                                f"--{option} for --method {method}")
    if method == "zero":
        problem = build_problem(problem.graph, problem.mesh, problem.profile, replace(problem.settings, zero=3),
                                problem.unit_s)
    if method not in HEURISTICS:
        raise SettingsError(f"--method: unknown method {method!r} (known: {', '.join(METHODS)})")
    strategies = HEURISTICS[method](problem)
    return make_plan(problem, strategies, method=method, status="HEURISTIC", memory_limit=memory_limit,
                     search_time_s=time.perf_counter() - start)


def _search(problem: Problem, memory_limit: float | None, method: str, time_limit_s: float, seed: int, jobs: int,
            progress: Progress | None, start: float) -> Plan:
    """The exact methods: decomposition (``exact``) or the single whole-graph program (``whole``)."""
    if method == "exact":
        result, notes = solve_exact(problem, memory_limit, time_limit_s, seed, jobs, progress)
    else:
        size = program_size(problem)
        if size > MAX_WHOLE_PROGRAM:
            return failed(problem, method=method, status="UNKNOWN", search_time_s=time.perf_counter() - start,
                          memory_limit=memory_limit, notes=("whole-graph integer program not attempted",),
                          explanation=f"whole-graph program too large to build ({size} Booleans > {MAX_WHOLE_PROGRAM})")
        result, notes = solve(problem, memory_limit, time_limit_s, seed), ("whole-graph integer program",)
    if result.choice is None:
        return failed(problem, method=method, status=result.status, search_time_s=time.perf_counter() - start,
                      memory_limit=memory_limit, explanation=result.explanation, notes=notes)
    if result.layer_recompute or result.layer_zero:  # chosen per layer: cost the plan under that choice
        problem = build_problem(problem.graph, problem.mesh, problem.profile,
                                replace(problem.settings, layer_recompute=result.layer_recompute,
                                        layer_zero=result.layer_zero), problem.unit_s)
        if problem.objective(result.choice) != result.objective or (memory_limit is not None
                                                               and problem.memory(result.choice) > memory_limit):
            raise RuntimeError("per-layer choice: the plan under its per-layer settings costs "
                               f"{problem.objective(result.choice)}, the search found {result.objective}")
    return make_plan(problem, strategies_from_choice(problem, result.choice), method=method, status=result.status,
                     memory_limit=memory_limit, search_time_s=time.perf_counter() - start, notes=notes,
                     explanation=result.explanation, bound=result.bound)


def evaluate(model: str | Graph, mesh: str | Mesh | Cluster | None = None, device: str | MachineProfile = "a100-80g", *,
             assignment: dict | None = None, tp: int | None = None, dp: int | None = None, pp: int = 1,
             batch: int | None = None, seq: int | None = None, memory: float | None = None,
             settings: TrainingSettings | None = None, hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV) -> Plan:
    """Cost a user plan: an ``{op: {axis: dim}}`` assignment on ``mesh``, or Megatron degrees ``tp``
    x ``dp`` (then the mesh is ``dp=D,tp=T`` and ``mesh`` must not be given, as on the CLI)."""
    if assignment is None and mesh is not None:
        raise SettingsError("--mesh: not with --tp/--dp/--pp (the mesh is pp=P,dp=D,tp=T); give an assignment "
                            "to cost a plan on a mesh of your own")
    if assignment is not None and mesh is None:
        raise SettingsError("--mesh: required with an assignment")
    if assignment is None:
        if pp != 1:
            raise SettingsError("--pp: pipeline degrees > 1 are evaluated by the pipeline planner (`planner pipeline`)")
        tp, dp = tp or 1, dp or 1
        mesh = f"dp={dp},tp={tp}" if tp > 1 and dp > 1 else f"{'tp' if tp > 1 else 'dp'}={tp * dp}"
    cluster = make_cluster(mesh, device, memory, hardware_csv=hardware_csv)
    problem = make_problem(model, cluster, settings, batch, seq)
    if assignment is None and problem.graph.batch_size % (dp or 1):  # (a given plan needs no batch size)
        raise SettingsError(f"--batch: the global batch {problem.graph.batch_size} is not divisible by --dp {dp}")
    start = time.perf_counter()
    if assignment is not None:
        strategies = strategies_from_mapping(problem, assignment)
    elif tp and tp > 1:
        strategies = megatron(problem, tensor_axis=-1)
    else:
        strategies = data_parallel(problem)
    return make_plan(problem, strategies, method="evaluate", status="GIVEN", memory_limit=cluster.memory_limit,
                     search_time_s=time.perf_counter() - start)


def compare(model: str | Graph, mesh: str | Mesh | Cluster = "8", device: str | MachineProfile = "a100-80g", *,
            methods: tuple[str, ...] = METHODS, batch: int | None = None, seq: int | None = None,
            memory: float | None = None, settings: TrainingSettings | None = None, time_limit_s: float = 60.0,
            seed: int = 0, hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV) -> list[dict]:
    """Plan one model with several methods under one cost model; one row per method with the gap to exact."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SettingsError(f"--methods: unknown method {unknown[0]!r} (known: {', '.join(METHODS)})")
    cluster = make_cluster(mesh, device, memory, hardware_csv=hardware_csv)
    graph = resolve_model(model, batch, seq)
    build_start = time.perf_counter()
    problem = make_problem(graph, cluster, settings)
    build_s = time.perf_counter() - build_start
    plans = {m: plan_problem(problem, cluster.memory_limit, m, time_limit_s, seed) for m in methods}
    reference = plans.get("exact")
    rows = []
    for method, p in plans.items():
        gap = None
        if reference is not None and reference.status == "OPTIMAL" and p.status not in ("INFEASIBLE", "UNKNOWN"):
            gap = 100.0 * (p.objective - reference.objective) / max(1, reference.objective)
        rows.append({"model": problem.graph.name, "mesh": cluster.mesh.spec, "device": cluster.profile.name,
                     "method": method, "status": p.status, "objective": p.objective,
                     "estimated_step_time_s": p.estimated_step_time_s, "gap_percent": gap, "compute_s": p.compute_s,
                     "comm_s": p.comm_s, "hidden_s": p.hidden_s, **{f"memory_{k}_bytes": v for k, v in p.memory_breakdown},
                     "memory_per_device_bytes": p.memory_per_device_bytes, "fits_memory": p.fits_memory,
                     "memory_limit_bytes": p.memory_limit_bytes, **{f"setting_{k}": v for k, v in p.settings},
                     "search_time_s": p.search_time_s + build_s, "notes": " | ".join(p.notes)})
    return rows


def model_loader(model: str | Graph, seq: int | None):
    """``batch -> graph``: a zoo model, or a graph JSON import-torch wrote (re-imported per batch)."""
    if not isinstance(model, str):
        raise SettingsError("--model: pipeline planning needs a zoo model (the batch is re-built per micro-batch)")
    from planner.engines.torch.presets import imported_loader
    return imported_loader(model, seq) if model.endswith(".json") else lambda b: resolve_model(model, b, seq)


def stage_planner(method: str = "exact", time_limit_s: float = 60.0, seed: int = 0, jobs: int = 1):
    """The per-stage intra-operator search of a 3D plan: any of ``METHODS`` (``zero`` is ``dp``
    with ZeRO-3 in the settings). Raises ``InfeasibleError`` when the method finds no plan."""
    if method not in METHODS:
        raise SettingsError(f"--method: unknown method {method!r} (known: {', '.join(METHODS)})")

    def run(problem: Problem) -> tuple[tuple, str]:
        found = plan_problem(problem, None, "dp" if method == "zero" else method, time_limit_s, seed, jobs)
        if found.status in ("INFEASIBLE", "UNKNOWN"):
            raise InfeasibleError(f"--method {method}: no stage plan on {problem.mesh.spec} ({found.explanation})")
        return tuple(tuple(d for _, d in a.strategy) for a in found.operators), found.status
    return run


def plan_pipeline(model: str, mesh: str | Mesh | Cluster | None = None, device: str | MachineProfile = "a100-80g", *,
                  devices: int | None = None, batch: int | None = None, seq: int | None = None,
                  memory: float | None = None, settings: TrainingSettings | None = None, schedule: str = "1f1b",
                  method: str = "csimd", intra: str = "exact", time_limit_s: float = 60.0, seed: int = 0,
                  jobs: int = 1, degrees: list[int] | None = None, counts: list[int] | None = None,
                  cuts: tuple[int, ...] | None = None, escalate: bool = True, fit_required: bool = True,
                  hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV, progress: Progress | None = None) -> Plan3D:
    """3D plan: pipeline degree over the outermost mesh axis, ``intra`` plans per stage, ``method`` cuts.

    ``mesh`` defaults to ``node=devices/gpus_per_node,gpu=gpus_per_node`` for the profile;
    ``degrees``, ``counts`` (micro-batch counts) and ``cuts`` pin parts of the search."""
    if isinstance(mesh, Cluster):
        _given_cluster(mesh, device, memory, devices)
        device = mesh.profile
    profile = device if isinstance(device, MachineProfile) else get_profile(device, hardware_csv)
    if mesh is None:
        if not devices:
            raise SettingsError("--devices: give the device count (or --mesh)")
        per_node = min(profile.gpus_per_node, devices)
        if devices % per_node:
            raise SettingsError(f"--devices: {devices} is not a multiple of {per_node} GPUs per node")
        mesh = f"node={devices // per_node},gpu={per_node}" if devices > per_node else f"node=1,gpu={per_node}"
    if method not in PIPELINE_METHODS:
        raise SettingsError(f"--pipeline-method: unknown cut search {method!r} (known: {', '.join(PIPELINE_METHODS)})")
    settings = settings or TrainingSettings()
    _refuse_auto(settings, "3D plans add recompute in their escalation when memory binds")
    if intra == "zero":
        settings = replace(settings, zero=3)
    cluster = make_cluster(mesh, profile, memory, devices)
    load = model_loader(model, seq)
    global_batch = resolve_model(model, batch, seq).batch_size
    return threed.plan_pipeline(load, cluster.mesh, cluster.profile, global_batch, settings, cluster.memory_limit,
                                    schedule, method, degrees, counts, stage_planner(intra, time_limit_s, seed, jobs),
                                    intra, cuts, escalate, fit_required, progress)


def evaluate_3d(model: str, device: str | MachineProfile = "a100-80g", *, tp: int = 1, pp: int = 1, dp: int = 1,
                micro_batch: int = 1, batch: int | None = None, seq: int | None = None,
                settings: TrainingSettings | None = None, schedule: str = "1f1b", memory: float | None = None,
                cuts: tuple[int, ...] | None = None, fit_required: bool = True,
                hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV) -> Plan3D:
    """Cost a Megatron-style 3D configuration through the 3D search pinned to it: mesh
    ``pp=P,dp=D,tp=T`` (tensor parallelism innermost, inside the node when it fits), Megatron's
    tensor-parallel plan (or data parallelism when tp = 1) in every stage, ``batch / (dp *
    micro_batch)`` micro-batches (with pp = 1: gradient accumulation), even layer split unless
    ``cuts`` are given. No recompute or ZeRO is added. Raises ``InfeasibleError`` if it does not
    fit, unless ``fit_required`` is off (then the plan is returned marked as not fitting)."""
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("micro-batch", micro_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SettingsError(f"--{name}: must be a positive integer, got {value!r}")
    global_batch = resolve_model(model, batch, seq).batch_size
    if global_batch % (dp * micro_batch):
        raise SettingsError(f"--batch: global batch {global_batch} is not divisible by dp x micro-batch ({dp} x {micro_batch})")
    mesh = ",".join([f"pp={pp}"] + [f"{name}={size}" for name, size in (("dp", dp), ("tp", tp)) if size > 1])
    result = plan_pipeline(model, mesh, device, batch=global_batch, seq=seq, memory=memory, settings=settings,
                           schedule=schedule, method="even", intra="megatron" if tp > 1 else "dp", degrees=[pp],
                           counts=[global_batch // (dp * micro_batch)], cuts=cuts, escalate=False,
                           fit_required=fit_required, hardware_csv=hardware_csv)
    for k, axis in enumerate(result.stage_mesh_names):
        if axis in ("dp", "tp") and not any(strategy[k] is not None for *_, strategy in result.operators):
            sizes = "the micro-batch" if axis == "dp" else "heads, ffn or vocabulary"
            raise SettingsError(f"--{axis}: {dict(dp=dp, tp=tp)[axis]} splits nothing in {result.model} "
                                f"(it divides none of {sizes}); choose a degree that divides them")
    return replace(result, notes=threed.replicated_linears(result, tp))


def layer_chain(model: str, mesh: str | Mesh, device: str | MachineProfile = "a100-80g", *, stages: int = 4,
                batch: int | None = None, seq: int | None = None, settings: TrainingSettings | None = None,
                hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV):
    """The layer chain of a zoo model for ``stages`` pipeline stages over the outermost mesh axis:
    the exact intra-operator plan on the stage sub-mesh, re-costed at every micro-batch count
    that divides the batch (see ``planner.pipeline.threed``)."""
    cluster = make_cluster(mesh, device, float("inf"), hardware_csv=hardware_csv)
    load = model_loader(model, seq)
    global_batch = resolve_model(model, batch, seq).batch_size
    sub = threed.stage_mesh(cluster.mesh, stages)
    found = threed.stage_chain(load, cluster.mesh, sub, cluster.profile, global_batch,
                                   settings or TrainingSettings(), stages, threed.divisors(global_batch))
    if found is None:
        raise SettingsError(f"--batch: no micro-batch count keeps the stage plan valid for {model}")
    return found


def evaluate_3d_file(data: dict, model: str, device: str | MachineProfile = "a100-80g", *, batch: int | None = None,
                     seq: int | None = None, settings: TrainingSettings | None = None, memory: float | None = None,
                     hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV, where: str = "--plan") -> Plan3D:
    """Re-cost a 3D plan JSON (``planner-3d/1`` or ``/2``) through the 3D search's chain and evaluator."""
    stages, count, schedule, cuts = pipeline_fields(data["pipeline"], where)
    cluster = make_cluster(data["mesh"], device, memory, hardware_csv=hardware_csv)
    load = model_loader(model, seq)
    global_batch = resolve_model(model, batch, seq).batch_size
    if global_batch % count:
        raise SettingsError(f"{where}: num_microbatches {count} does not divide the batch {global_batch}")
    sub = threed.stage_mesh(cluster.mesh, stages)
    settings = settings or TrainingSettings()
    _refuse_auto(settings, "a 3D plan file fixes one recompute mode")
    problem = build_problem(load(global_batch // count), sub, cluster.profile, settings)
    chosen = strategies_from_mapping(problem, {o["name"]: o["strategy"] for o in data["operators"]}, where=where)
    strategies = {t.op.name: s for t, s in zip(problem.ops, chosen)}
    return threed.recost(load, cluster.mesh, cluster.profile, global_batch, settings, cluster.memory_limit, stages,
                             cuts, count, schedule, strategies, str(data.get("intra_method", "given")))


def _refuse_auto(settings: TrainingSettings, why: str) -> None:
    for option, value in (("recompute", settings.recompute), ("zero", settings.zero)):
        if value == AUTO:
            raise SettingsError(f"--{option} auto: not for pipeline plans ({why}); give a fixed --{option}")


def describe_error(exc: Exception) -> str:
    return str(exc) if isinstance(exc, PlannerError) else f"{type(exc).__name__}: {exc}"
