"""The public Python API: plan, evaluate and compare models on a cluster.

from planner import plan
result = plan("gpt2-small", mesh="2x4", device="a100-80g")
print(result.estimated_step_time_s, result.status)
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping

from planner.search.options import SEARCH_DEFAULTS
from planner.cost.settings import AUTO, TrainingSettings
from planner.errors import PlannerError, SettingsError
from planner.ir.graph import Graph
from planner.ir.rebatch import rebatched
from planner.cluster.cluster import checked_limit, Cluster, make_cluster
from planner.cluster.mesh import Mesh
from planner.cluster.profiles import DEFAULT_HARDWARE_CSV, MachineProfile
from planner.plans import Plan, make_plan, strategies_from_mapping
from planner.cost.problem import Problem, build_problem
from planner.methods import METHODS, Call, method as registered_method
from planner.search.baselines import data_parallel, megatron
from planner.search.layer_modes import auto_options, refuse_auto_without_layers
from planner.search.reduce import Progress
from planner.search.restrict import pinned
from planner.zoo import load_model
from planner.ir.graph_json import load_graph

REPORT_SECONDS_PER_OP = 1.3e-5  # the plan report: measured 0.9-1.3 s per 100k operators (make_plan)


def resolve_model(model: str | Graph, batch: int | None = None, seq: int | None = None) -> Graph:
    """A zoo spec, a graph JSON file or a built ``Graph`` as a graph at ``batch`` (default: its
    own). A built graph keeps its sequence length: ``seq`` with one is refused."""
    if isinstance(model, Graph) or (isinstance(model, str) and model.endswith(".json")):
        if seq is not None:
            raise SettingsError(
                "--seq: a built graph keeps its sequence length (build it at the one you want)"
            )
        if isinstance(model, str):
            model = load_graph(model)
        return model if batch is None else rebatched(model, batch)
    return load_model(model, batch, seq)


def make_problem(
    model: str | Graph,
    cluster: Cluster,
    settings: TrainingSettings | None = None,
    batch: int | None = None,
    seq: int | None = None,
    num_microbatches: int = 1,
) -> Problem:
    """The model costed on the cluster; with ``num_microbatches`` > 1 the graph is one
    micro-batch (the batch / M) of a step that accumulates M of them."""
    if settings is not None and settings.loss_kernel != "torch":
        raise SettingsError(
            "--loss-kernel: a flat plan prices no loss backward buffers (they are a pipeline "
            "stage's working set): give it to 3D plans (--pipeline auto, evaluate --tp/--pp)"
        )
    graph = resolve_model(model, batch, seq)
    count = num_microbatches
    if count != 1:
        if type(count) is not int or count < 1 or graph.batch_size % count:
            raise SettingsError(
                f"--num-microbatches: {count!r} is not a divisor of the batch {graph.batch_size}"
            )
        graph = resolve_model(model, graph.batch_size // count, seq)
    return build_problem(
        graph,
        cluster.mesh,
        cluster.profile,
        settings or TrainingSettings(),
        num_microbatches=num_microbatches,
    )


def plan(
    model: str | Graph,
    mesh: str | Mesh | Cluster = "8",
    device: str | MachineProfile = "a100-80g",
    *,
    method: str = "exact",
    batch: int | None = None,
    seq: int | None = None,
    memory: float | None = None,
    settings: TrainingSettings | None = None,
    time_limit_s: float = SEARCH_DEFAULTS.time_limit_s,
    seed: int = SEARCH_DEFAULTS.seed,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
    jobs: int = SEARCH_DEFAULTS.jobs,
    progress: Progress | None = None,
    fixed: Mapping[str, Mapping[str, str | None]] | None = None,
    num_microbatches: int = 1,
) -> Plan:
    """Plan a model on a cluster with one search method (see ``METHODS``).

    ``time_limit_s`` counts from this call: loading the model, costing, the search and the plan
    report; ``search_time_s`` of the result counts costing and search only. ``fixed={op: {mesh
    axis: dim or None}}`` pins those operators to the given strategies (an axis left out
    replicates); the exact methods then find the best plan of the rest (``search.restrict``).
    ``num_microbatches``: micro-batches a step accumulates (``accumulation.plan_counts``: all)."""
    begun = time.perf_counter()
    cluster = make_cluster(mesh, device, memory, hardware_csv=hardware_csv)
    graph = resolve_model(model, batch, seq)
    start = time.perf_counter()  # search time: costing every strategy and edge, then the search
    problem = (
        make_problem(graph, cluster, settings)
        if num_microbatches == 1
        else make_problem(model, cluster, settings, batch, seq, num_microbatches)
    )
    if fixed:
        problem = _pin(problem, fixed, method)
    # the plan report takes time too
    report_s = REPORT_SECONDS_PER_OP * len(problem.ops)
    remaining = max(0.0, time_limit_s - (time.perf_counter() - begun) - report_s)
    result = plan_problem(
        problem, cluster.memory_limit, method, remaining, seed=seed, jobs=jobs, progress=progress
    )
    return replace(result, search_time_s=time.perf_counter() - start)


def _pin(problem: Problem, fixed: Mapping[str, Mapping[str, str | None]], method: str) -> Problem:
    """The problem with the ``fixed`` operators pinned; only the exact methods honour a pin, and
    not under a per-layer ``auto`` (its variants are rebuilt from the graph)."""
    if method not in ("exact", "whole"):
        raise SettingsError(
            "fixed: only the exact methods (exact, whole) search around pinned operators, not "
            f"method {method!r}"
        )
    if AUTO in (problem.settings.recompute, problem.settings.zero):
        raise SettingsError(
            "fixed: pinned operators with recompute or zero 'auto' are not supported; give fixed "
            "settings"
        )
    return pinned(problem, fixed)


def plan_problem(
    problem: Problem,
    memory_limit: float,
    method: str = "exact",
    time_limit_s: float = SEARCH_DEFAULTS.time_limit_s,
    *,
    seed: int = SEARCH_DEFAULTS.seed,
    jobs: int = SEARCH_DEFAULTS.jobs,
    progress: Progress | None = None,
) -> Plan:
    """Search a plan for a built problem with one method (see ``METHODS``) under ``memory_limit``
    bytes per device (inf: none; a Cluster's ``memory_limit``)."""
    start = time.perf_counter()
    memory_limit = checked_limit(memory_limit)
    refuse_auto_without_layers(problem)
    chosen = registered_method(method)
    for option in [] if chosen.chooses_auto else auto_options(problem.settings):
        raise SettingsError(
            f"--{option} auto: only --method exact chooses it per layer; give a fixed "
            f"--{option} for --method {method}"
        )
    return chosen.solve(problem, memory_limit, Call(time_limit_s, seed, jobs, progress, start))


def _evaluated_mesh(mesh, assignment: dict | None, tp: int | None, dp: int | None, pp: int):
    """The mesh of a plan given by assignment (its own), or ``dp=D,tp=T`` for Megatron degrees."""
    if assignment is None and mesh is not None:
        raise SettingsError(
            "--mesh: not with --tp/--dp/--pp (the mesh is pp=P,dp=D,tp=T); give an assignment to "
            "cost a plan on a mesh of your own"
        )
    if assignment is not None and mesh is None:
        raise SettingsError("--mesh: required with an assignment")
    if assignment is not None:
        return mesh
    if pp != 1:
        raise SettingsError(
            "--pp: pipeline degrees > 1 are evaluated by the pipeline planner (`planner pipeline`)"
        )
    return f"dp={dp},tp={tp}" if tp > 1 and dp > 1 else f"{'tp' if tp > 1 else 'dp'}={tp * dp}"


def evaluate(
    model: str | Graph,
    mesh: str | Mesh | Cluster | None = None,
    device: str | MachineProfile = "a100-80g",
    *,
    assignment: dict | None = None,
    tp: int | None = None,
    dp: int | None = None,
    pp: int = 1,
    batch: int | None = None,
    seq: int | None = None,
    memory: float | None = None,
    settings: TrainingSettings | None = None,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
    num_microbatches: int = 1,
) -> Plan:
    """Cost a user plan: an ``{op: {axis: dim}}`` assignment on ``mesh``, or Megatron degrees ``tp``
    x ``dp`` (then the mesh is ``dp=D,tp=T`` and ``mesh`` must not be given, as on the CLI), for a
    step of ``num_microbatches`` micro-batches."""
    if assignment is None:
        tp, dp = tp or 1, dp or 1
    mesh = _evaluated_mesh(mesh, assignment, tp, dp, pp)
    cluster = make_cluster(mesh, device, memory, hardware_csv=hardware_csv)
    problem = make_problem(model, cluster, settings, batch, seq, num_microbatches)
    # (a given plan needs no batch size)
    if assignment is None and problem.graph.batch_size % (dp or 1):
        raise SettingsError(
            f"--batch: the global batch {problem.graph.batch_size} is not divisible by --dp {dp}"
        )
    start = time.perf_counter()
    if assignment is not None:
        strategies = strategies_from_mapping(problem, assignment)
    elif tp and tp > 1:
        strategies = megatron(problem, tensor_axis=-1)
    else:
        strategies = data_parallel(problem)
    return make_plan(
        problem,
        strategies,
        method="evaluate",
        status="GIVEN",
        memory_limit=cluster.memory_limit,
        search_time_s=time.perf_counter() - start,
    )


def compare(
    model: str | Graph,
    mesh: str | Mesh | Cluster = "8",
    device: str | MachineProfile = "a100-80g",
    *,
    methods: tuple[str, ...] | None = None,
    batch: int | None = None,
    seq: int | None = None,
    memory: float | None = None,
    settings: TrainingSettings | None = None,
    time_limit_s: float = SEARCH_DEFAULTS.time_limit_s,
    seed: int = SEARCH_DEFAULTS.seed,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
) -> list[dict]:
    """Plan one model with several methods (default: every registered one) under one cost model;
    one row per method with the gap to exact."""
    methods = tuple(METHODS) if methods is None else methods
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SettingsError(
            f"--methods: unknown method {unknown[0]!r} (known: {', '.join(METHODS)})"
        )
    cluster = make_cluster(mesh, device, memory, hardware_csv=hardware_csv)
    graph = resolve_model(model, batch, seq)
    build_start = time.perf_counter()
    problem = make_problem(graph, cluster, settings)
    build_s = time.perf_counter() - build_start
    plans = {
        m: plan_problem(problem, cluster.memory_limit, m, time_limit_s, seed=seed) for m in methods
    }
    reference = plans.get("exact")
    return [_compare_row(problem, method, p, reference, build_s) for method, p in plans.items()]


def _compare_row(problem: Problem, method: str, p: Plan, reference: Plan | None, build_s: float):
    """One method's row of ``compare``: its plan's figures, and its gap to an OPTIMAL exact plan."""
    gap = None
    if (
        reference is not None
        and reference.status == "OPTIMAL"
        and p.status not in ("INFEASIBLE", "UNKNOWN")
    ):
        gap = 100.0 * (p.objective - reference.objective) / max(1, reference.objective)
    return {
        "model": problem.graph.name,
        "mesh": problem.mesh.spec,
        "device": problem.profile.name,
        "method": method,
        "status": p.status,
        "objective": p.objective,
        "estimated_step_time_s": p.estimated_step_time_s,
        "gap_to_exact_percent": gap,
        "compute_s": p.compute_s,
        "comm_s": p.comm_s,
        "hidden_s": p.hidden_s,
        **{f"memory_{k}_bytes": v for k, v in p.memory_breakdown},
        "memory_per_device_bytes": p.memory_per_device_bytes,
        "fits_memory": p.fits_memory,
        "memory_limit_bytes": p.memory_limit_bytes,
        **{f"setting_{k}": v for k, v in p.settings},
        "search_time_s": p.search_time_s + build_s,
        "notes": " | ".join(p.notes),
    }


def describe_error(exc: Exception) -> str:
    return str(exc) if isinstance(exc, PlannerError) else f"{type(exc).__name__}: {exc}"
