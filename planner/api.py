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

from planner.cost import TrainingSettings
from planner.errors import PlannerError, SettingsError
from planner.graph import Graph
from planner.heuristics import data_parallel, drec, greedy, megatron
from planner.mesh import DEFAULT_HARDWARE_CSV, MachineProfile, Mesh, get_profile, parse_mesh
from planner.plans import Plan, make_plan, strategies_from_choice, strategies_from_mapping
from planner.problem import Problem, build_problem
from planner.exact import MAX_WHOLE_PROGRAM, Progress, program_size, solve_exact
from planner.solver import solve
from planner import pipeline3d
from planner.pipeline import METHODS as PIPELINE_METHODS
from planner.pipeline3d import Plan3D
from planner.pipeline import PipelinePlan
from planner.zoo import load_model

HEURISTICS = {"drec": drec, "dp": data_parallel, "zero": data_parallel, "megatron": megatron, "greedy": greedy}
METHODS = ("exact", "whole") + tuple(HEURISTICS)


@dataclass(frozen=True, slots=True)
class Cluster:
    """A mesh on a machine profile, with the per-device memory limit (bytes, None: unlimited)."""

    mesh: Mesh
    profile: MachineProfile
    memory_limit: float | None


def make_cluster(mesh: str | Mesh, device: str | MachineProfile = "a100-80g", memory: float | None = None,
                 devices: int | None = None, hardware_csv: Path | str = DEFAULT_HARDWARE_CSV) -> Cluster:
    profile = device if isinstance(device, MachineProfile) else get_profile(device, hardware_csv)
    mesh_obj = mesh if isinstance(mesh, Mesh) else parse_mesh(str(mesh), profile, devices)
    if memory is not None and (not isinstance(memory, (int, float)) or math.isnan(memory) or memory <= 0):
        raise SettingsError(f"--memory: must be a positive number of bytes (or inf for no limit), got {memory!r}")
    if memory is None:
        limit = None if profile.name == "symbolic" else profile.memory_bytes
    else:
        limit = None if math.isinf(memory) else float(memory)
    return Cluster(mesh_obj, profile, limit)


def resolve_model(model: str | Graph, batch: int | None = None, seq: int | None = None) -> Graph:
    if isinstance(model, Graph):
        return model
    if isinstance(model, str) and model.endswith(".json"):
        from planner.io import load_graph
        return load_graph(model)
    return load_model(model, batch, seq)


def make_problem(model: str | Graph, cluster: Cluster, settings: TrainingSettings | None = None,
                 batch: int | None = None, seq: int | None = None) -> Problem:
    return build_problem(resolve_model(model, batch, seq), cluster.mesh, cluster.profile, settings or TrainingSettings())


def plan(model: str | Graph, mesh: str | Mesh = "8", device: str | MachineProfile = "a100-80g", *,
         method: str = "exact", batch: int | None = None, seq: int | None = None, memory: float | None = None,
         settings: TrainingSettings | None = None, time_limit_s: float = 60.0, seed: int = 0,
         hardware_csv: Path | str = DEFAULT_HARDWARE_CSV, jobs: int = 1, progress: Progress | None = None) -> Plan:
    """Plan a model on a cluster with one search method (see ``METHODS``)."""
    cluster = make_cluster(mesh, device, memory, hardware_csv=hardware_csv)
    graph = resolve_model(model, batch, seq)
    start = time.perf_counter()  # search time: costing every strategy and edge, then the search
    problem = make_problem(graph, cluster, settings)
    result = plan_problem(problem, cluster.memory_limit, method, time_limit_s, seed, jobs, progress)
    return replace(result, search_time_s=time.perf_counter() - start)


def plan_problem(problem: Problem, memory_limit: float | None, method: str = "exact", time_limit_s: float = 60.0,
                 seed: int = 0, jobs: int = 1, progress: Progress | None = None) -> Plan:
    """Search a plan for a built problem with one method (see ``METHODS``)."""
    start = time.perf_counter()
    if method in ("exact", "whole"):
        return _search(problem, memory_limit, method, time_limit_s, seed, jobs, progress, start)
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
            return _failed_plan(problem, method, "UNKNOWN", time.perf_counter() - start, memory_limit,
                                f"whole-graph program too large to build ({size} Booleans > {MAX_WHOLE_PROGRAM})",
                                ("whole-graph integer program not attempted",))
        result, notes = solve(problem, memory_limit, time_limit_s, seed), ("whole-graph integer program",)
    if result.choice is None:
        return _failed_plan(problem, method, result.status, time.perf_counter() - start, memory_limit,
                            result.explanation, notes)
    return make_plan(problem, strategies_from_choice(problem, result.choice), method=method, status=result.status,
                     memory_limit=memory_limit, search_time_s=time.perf_counter() - start, notes=notes,
                     explanation=result.explanation)


def _failed_plan(problem: Problem, method: str, status: str, elapsed: float, memory_limit: float | None,
                 explanation: str, notes: tuple[str, ...] = ()) -> Plan:
    """No plan was found: report the replicated plan's figures with the failing status."""
    replicated = tuple(tuple(None for _ in problem.mesh.axes) for _ in problem.ops)
    return make_plan(problem, replicated, method=method, status=status, memory_limit=memory_limit,
                     search_time_s=elapsed, explanation=explanation, notes=notes)


def evaluate(model: str | Graph, mesh: str | Mesh, device: str | MachineProfile = "a100-80g", *,
             assignment: dict | None = None, tp: int | None = None, dp: int | None = None, pp: int = 1,
             batch: int | None = None, seq: int | None = None, memory: float | None = None,
             settings: TrainingSettings | None = None, hardware_csv: Path | str = DEFAULT_HARDWARE_CSV) -> Plan:
    """Cost a user plan: an ``{op: {axis: dim}}`` assignment, or Megatron degrees ``tp`` x ``dp``."""
    if assignment is None:
        if pp != 1:
            raise SettingsError("--pp: pipeline degrees > 1 are evaluated by the pipeline planner (`planner pipeline`)")
        tp, dp = tp or 1, dp or 1
        mesh = f"dp={dp},tp={tp}" if tp > 1 and dp > 1 else f"{'tp' if tp > 1 else 'dp'}={tp * dp}"
    cluster = make_cluster(mesh, device, memory, hardware_csv=hardware_csv)
    problem = make_problem(model, cluster, settings, batch, seq)
    samples = problem.graph.tensors[0].shape[0]
    if assignment is None and samples % (dp or 1):
        raise SettingsError(f"--batch: the global batch {samples} is not divisible by --dp {dp}")
    start = time.perf_counter()
    if assignment is not None:
        strategies = strategies_from_mapping(problem, assignment)
    elif tp and tp > 1:
        strategies = megatron(problem, tensor_axis=-1)
    else:
        strategies = data_parallel(problem)
    return make_plan(problem, strategies, method="evaluate", status="GIVEN", memory_limit=cluster.memory_limit,
                     search_time_s=time.perf_counter() - start)


def compare(model: str | Graph, mesh: str | Mesh = "8", device: str | MachineProfile = "a100-80g", *,
            methods: tuple[str, ...] = METHODS, batch: int | None = None, seq: int | None = None,
            memory: float | None = None, settings: TrainingSettings | None = None, time_limit_s: float = 60.0,
            seed: int = 0, hardware_csv: Path | str = DEFAULT_HARDWARE_CSV) -> list[dict]:
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
                     "estimated_step_time_s": p.estimated_step_time_s, "gap_percent": gap,
                     "memory_per_device_bytes": p.memory_per_device_bytes, "fits_memory": p.fits_memory,
                     "search_time_s": p.search_time_s + build_s, "notes": " | ".join(p.notes)})
    return rows


def plan_pipeline(model: str, mesh: str | Mesh | None = None, device: str | MachineProfile = "a100-80g", *,
                  devices: int | None = None, batch: int | None = None, seq: int | None = None,
                  memory: float | None = None, settings: TrainingSettings | None = None, schedule: str = "1f1b",
                  method: str = "csimd", hardware_csv: Path | str = DEFAULT_HARDWARE_CSV,
                  progress: Progress | None = None) -> Plan3D:
    """3D plan: pipeline degree over the outermost mesh axis, exact intra-operator plans per stage.

    ``mesh`` defaults to ``node=devices/gpus_per_node,gpu=gpus_per_node`` for the profile.
    """
    profile = device if isinstance(device, MachineProfile) else get_profile(device, hardware_csv)
    if mesh is None:
        if not devices:
            raise SettingsError("--devices: give the device count (or --mesh)")
        per_node = min(profile.gpus_per_node, devices)
        if devices % per_node:
            raise SettingsError(f"--devices: {devices} is not a multiple of {per_node} GPUs per node")
        mesh = f"node={devices // per_node},gpu={per_node}" if devices > per_node else f"node=1,gpu={per_node}"
    if method not in PIPELINE_METHODS:
        raise SettingsError(f"--method: unknown pipeline method {method!r} (known: {', '.join(PIPELINE_METHODS)})")
    cluster = make_cluster(mesh, profile, memory, devices)
    graph = resolve_model(model, batch, seq)
    global_batch = graph.tensors[0].shape[0]
    load = (lambda b: resolve_model(model, b, seq)) if isinstance(model, str) and not model.endswith(".json") else None
    if load is None:
        raise SettingsError("--model: pipeline planning needs a zoo model (the batch is re-built per micro-batch)")
    return pipeline3d.plan_pipeline(load, cluster.mesh, cluster.profile, global_batch, settings or TrainingSettings(),
                                    cluster.memory_limit, schedule, method, progress=progress)


def evaluate_3d(model: str, device: str | MachineProfile = "a100-80g", *, tp: int = 1, pp: int = 1, dp: int = 1,
                micro_batch: int = 1, batch: int | None = None, seq: int | None = None,
                settings: TrainingSettings | None = None, schedule: str = "1f1b", memory: float | None = None,
                hardware_csv: Path | str = DEFAULT_HARDWARE_CSV) -> PipelinePlan:
    """Cost a Megatron-style 3D configuration: ``tp``-way tensor parallelism innermost (inside the
    node when it fits), ``dp``-way data parallelism, ``pp`` pipeline stages with layers split
    evenly, ``batch / (dp * micro_batch)`` micro-batches under ``schedule``. Nothing is searched."""
    profile = device if isinstance(device, MachineProfile) else get_profile(device, hardware_csv)
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("micro-batch", micro_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SettingsError(f"--{name}: must be a positive integer, got {value!r}")
    global_batch = resolve_model(model, batch, seq).tensors[0].shape[0]
    if global_batch % (dp * micro_batch):
        raise SettingsError(f"--batch: global batch {global_batch} is not divisible by dp x micro-batch ({dp} x {micro_batch})")
    axes = [f"{name}={size}" for name, size in (("dp", dp), ("tp", tp)) if size > 1]
    stage = make_cluster(",".join(axes) or "gpu=1", profile, float("inf")).mesh
    # Stage boundaries cross nodes once a stage fills a node (Megatron places pipeline outermost).
    link = make_cluster(f"pp={max(pp, 2)},stage={dp * tp}", profile, float("inf")).mesh.axes[0]
    settings = settings or TrainingSettings()
    load = lambda b: resolve_model(model, b, seq)
    problem = build_problem(load(dp * micro_batch), stage, profile, settings)
    chosen = megatron(problem, tensor_axis=-1) if tp > 1 else data_parallel(problem)
    strategies = {table.op.name: s for table, s in zip(problem.ops, chosen)}
    count = global_batch // (dp * micro_batch)
    chain = pipeline3d.model_chain(load, global_batch, [count], stage, profile, settings, strategies, link)
    if chain is None or pp > chain.num_layers:
        raise SettingsError(f"--pp: {pp} stages do not fit the model's layers or the plan does not divide the micro-batch")
    limit = make_cluster(stage, profile, memory).memory_limit
    return PIPELINE_METHODS["even"](chain, pp, schedule, limit)


def layer_chain(model: str, mesh: str | Mesh, device: str | MachineProfile = "a100-80g", *, stages: int = 4,
                batch: int | None = None, seq: int | None = None, settings: TrainingSettings | None = None,
                hardware_csv: Path | str = DEFAULT_HARDWARE_CSV):
    """The layer chain of a zoo model for ``stages`` pipeline stages over the outermost mesh axis:
    the exact intra-operator plan on the stage sub-mesh, re-costed at every power-of-two
    micro-batch count (see ``planner.pipeline3d``)."""
    cluster = make_cluster(mesh, device, float("inf"), hardware_csv=hardware_csv)
    graph = resolve_model(model, batch, seq)
    global_batch = graph.tensors[0].shape[0]
    load = lambda b: resolve_model(model, b, seq)
    counts = [c for c in range(1, global_batch + 1) if global_batch % c == 0 and c & (c - 1) == 0]
    sub = pipeline3d.stage_mesh(cluster.mesh, stages)
    found = pipeline3d.stage_chain(load, cluster.mesh, sub, cluster.profile, global_batch,
                                   settings or TrainingSettings(), stages, counts)
    if found is None:
        raise SettingsError(f"--batch: no micro-batch count keeps the stage plan valid for {model}")
    return found


@dataclass(frozen=True, slots=True)
class LoadedPlan:
    """A plan file resolved against its model: the graph, the mesh and one strategy per operator."""

    graph: Graph
    mesh: Mesh
    strategies: dict


def load_plan(path: Path | str, model: str | Graph | None = None, batch: int | None = None,
              seq: int | None = None) -> LoadedPlan:
    """Read a plan JSON (``planner plan --json``); the model comes from its 'source' unless given."""
    import json
    try:
        data = json.loads(Path(path).read_text())
        operators = {o["name"]: o["strategy"] for o in data["operators"]}
        mesh_spec = data["mesh"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SettingsError(f"--plan: cannot read a plan from {path} ({exc})") from None
    source = data.get("source") or {}
    if model is None:
        if "model" not in source:
            raise SettingsError(f"--plan: {path} has no 'source' model; pass --model")
        model, batch, seq = source["model"], batch or source.get("batch"), seq or source.get("seq")
    graph = resolve_model(model, batch, seq)
    mesh = parse_mesh(mesh_spec, get_profile("symbolic"))
    problem = build_problem(graph, mesh, get_profile("symbolic"))
    strategies = strategies_from_mapping(problem, operators, where=f"--plan {path}")
    return LoadedPlan(graph, mesh, {t.op.name: s for t, s in zip(problem.ops, strategies)})


def plan_for_verification(model: str | Graph, mesh: str, method: str = "exact", *, batch: int | None = None,
                          seq: int | None = None, device: str = "a100-80g") -> LoadedPlan:
    """Plan under the settings the XLA check compiles (float32, SGD, no ZeRO, no memory limit)."""
    from planner.verify import VERIFY_SETTINGS
    cluster = make_cluster(mesh, device, float("inf"))
    graph = resolve_model(model, batch, seq)
    result = plan_problem(make_problem(graph, cluster, VERIFY_SETTINGS), None, method)
    strategies = {a.name: tuple(d for _, d in a.strategy) for a in result.operators}
    return LoadedPlan(graph, cluster.mesh, strategies)


def export_shardings(loaded: LoadedPlan, tensor_axis: str | None = None) -> dict:
    """JAX PartitionSpecs, DTensor placements and a Linear parallelize plan of a loaded plan."""
    from planner.export import export_plan, linear_parallel_plan
    exported = export_plan(loaded.graph, loaded.strategies, loaded.mesh)
    data = exported.to_dict(loaded.graph)
    axis = tensor_axis or loaded.mesh.names[-1]
    data["parallelize_plan"] = {"mesh_axis": axis, "modules": linear_parallel_plan(loaded.graph, exported, axis)}
    return data


def verify_loaded(loaded: LoadedPlan, *, run_numpy: bool = True, run_xla: bool = True, tolerance: float = 0.05,
           devices: int | None = None):
    """Numpy executor and XLA checks of a loaded plan (``planner.verify``)."""
    from planner.verify import verify_plan
    if devices is not None and devices != loaded.mesh.num_devices:
        raise SettingsError(f"--devices: the plan's mesh {loaded.mesh.spec} has {loaded.mesh.num_devices} devices, not {devices}")
    return verify_plan(loaded.graph, loaded.strategies, loaded.mesh, run_numpy=run_numpy, run_xla=run_xla,
                       tolerance=tolerance)


def describe_error(exc: Exception) -> str:
    return str(exc) if isinstance(exc, PlannerError) else f"{type(exc).__name__}: {exc}"
