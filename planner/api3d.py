"""The 3D part of the public API: pipeline plans (degree, cuts, micro-batches and every stage's
intra-operator plan), Megatron-style 3D configurations costed, layer chains and 3D plan files
re-costed. The flat plans are in ``planner.api``."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Callable

from planner import api
from planner.search.options import SEARCH_DEFAULTS
from planner.cluster.cluster import Cluster, check_given_cluster, make_cluster
from planner.cluster.mesh import Mesh
from planner.cluster.profiles import DEFAULT_HARDWARE_CSV, MachineProfile, get_profile
from planner.cost.problem import Problem, build_problem
from planner.cost.settings import AUTO, RECOMPUTE, TrainingSettings
from planner.errors import InfeasibleError, SettingsError
from planner.ir.graph import Graph
from planner.ir.rebatch import rebatched
from planner.pipeline import degree_search, threed
from planner.pipeline.search import METHODS as PIPELINE_METHODS
from planner.pipeline.plan3d import Plan3D, replicated_linears
from planner.pipeline.stage_chain import StageChain
from planner.plan_files import pipeline_fields
from planner.plans import strategies_from_choice, strategies_from_mapping
from planner.search.exact import solve_exact
from planner.search.layer_modes import refuse_auto_without_layers
from planner.search.reduce import Progress
from planner.engines.torch.presets import imported_loader


def model_loader(model: str | Graph, seq: int | None):
    """``batch -> graph``: a zoo model; a built ``Graph`` at each batch (``planner.ir.rebatch``);
    or a graph JSON import-torch wrote (re-imported per batch)."""
    if isinstance(model, Graph):
        api.resolve_model(model, None, seq)  # refuses seq: a built graph keeps its own
        return lambda b: rebatched(model, b)
    if not isinstance(model, str):
        raise SettingsError(f"--model: must be a model spec or a Graph, got {model!r}")

    return (
        imported_loader(model, seq)
        if model.endswith(".json")
        else lambda b: api.resolve_model(model, b, seq)
    )


def _global_batch(model: str | Graph, batch: int | None, seq: int | None) -> int:
    """The global batch of a 3D search (a graph JSON's ``seq`` is its loader's, not the file's)."""
    built = isinstance(model, str) and model.endswith(".json")
    return api.resolve_model(model, batch, None if built else seq).batch_size


def stage_planner(
    method: str = "exact",
    time_limit_s: float = SEARCH_DEFAULTS.time_limit_s,
    seed: int = SEARCH_DEFAULTS.seed,
    jobs: int = SEARCH_DEFAULTS.jobs,
):
    """The per-stage intra-operator search of a 3D plan: any of ``METHODS`` (``zero`` is ``dp``
    with ZeRO-3 in the settings). Raises ``InfeasibleError`` when the method finds no plan."""
    if method not in api.METHODS:
        raise SettingsError(
            f"--method: unknown method {method!r} (known: {', '.join(api.METHODS)})"
        )

    def run(problem: Problem) -> tuple[tuple, str]:
        if method == "exact":
            return _exact_strategies(problem, time_limit_s, seed, jobs)
        found = api.plan_problem(
            problem,
            math.inf,
            "dp" if method == "zero" else method,
            time_limit_s,
            seed=seed,
            jobs=jobs,
        )
        if found.status in ("INFEASIBLE", "UNKNOWN"):
            raise InfeasibleError(
                f"--method {method}: no stage plan on {problem.mesh.spec} ({found.explanation})"
            )
        return tuple(tuple(d for _, d in a.strategy) for a in found.operators), found.status

    return run


def _exact_strategies(problem: Problem, time_limit_s: float, seed: int, jobs: int):
    """The exact search's strategies (a dim or None per mesh axis) and status for one stage
    problem: the stage chain reads nothing else, so no ``Plan`` is made (its cost breakdown
    re-costs every operator: a tenth of the certified search); ``api.plan_problem``'s check
    kept."""
    refuse_auto_without_layers(problem)
    result, _ = solve_exact(problem, math.inf, time_limit_s, seed, jobs)
    if result.choice is None:
        raise InfeasibleError(
            f"--method exact: no stage plan on {problem.mesh.spec} ({result.explanation})"
        )
    return strategies_from_choice(problem, result.choice), result.status


def plan_pipeline(
    model: str | Graph,
    mesh: str | Mesh | Cluster | None = None,
    device: str | MachineProfile = "a100-80g",
    *,
    devices: int | None = None,
    batch: int | None = None,
    seq: int | None = None,
    memory: float | None = None,
    settings: TrainingSettings | None = None,
    schedule: str = "1f1b",
    method: str = "csimd",
    intra: str = "exact",
    time_limit_s: float = SEARCH_DEFAULTS.time_limit_s,
    seed: int = SEARCH_DEFAULTS.seed,
    jobs: int = SEARCH_DEFAULTS.jobs,
    degrees: list[int] | None = None,
    counts: list[int] | None = None,
    cuts: tuple[int, ...] | None = None,
    escalate: bool = True,
    fit_required: bool = True,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
    progress: Progress | None = None,
    admits: Callable[[Plan3D], bool] | None = None,
    recompute_ladder: tuple[str, ...] = RECOMPUTE,
    certify: bool = False,
) -> Plan3D:
    """3D plan: pipeline degree over the outer part of the mesh, ``intra`` plans per stage,
    ``method`` cuts. ``mesh`` defaults to ``node=devices/gpus_per_node,gpu=gpus_per_node``;
    ``degrees``, ``counts`` (micro-batch counts) and ``cuts`` pin parts of the search; ``admits``
    and ``recompute_ladder``: an engine's (``planner.launch.plan_for``); ``certify``: exhaustive
    over the stated space, OPTIMAL when every solve is proven (``threed.certified``)."""
    if isinstance(mesh, Cluster):
        check_given_cluster(mesh, device, memory, devices)
        device = mesh.profile
    profile = device if isinstance(device, MachineProfile) else get_profile(device, hardware_csv)
    mesh = _default_mesh(profile, devices) if mesh is None else mesh
    settings = _pipeline_settings(settings, method, intra)
    cluster = make_cluster(mesh, profile, memory, devices)
    load = model_loader(model, seq)
    global_batch = _global_batch(model, batch, seq)
    # Megatron-LM's stage plans at every tensor degree of a node; other planners: the user's choice
    tensor = escalate and intra in ("exact", "megatron-grid")
    pinned = (_tuple(degrees), _tuple(counts), cuts, escalate, fit_required, tensor, admits)
    _check_certify(certify, intra)
    options = threed.PipelineOptions(schedule, method, *pinned, tuple(recompute_ladder), certify)
    planner = stage_planner(intra, time_limit_s, seed, jobs)
    return threed.plan_pipeline(
        load, cluster, global_batch, settings, options, planner, intra, progress
    )


def _check_certify(certify, intra: str) -> None:
    """A certified search proves optimality over stage plans it solves exactly (or an engine's
    fixed patterns, which it costs as they are)."""
    if certify is not False and (certify is not True or intra not in ("exact", "megatron-grid")):
        raise SettingsError(
            f"certify: True or False, with the exact stage planner (or an engine's search), got "
            f"{certify!r} with --method {intra}"
        )


def _tuple(values) -> tuple | None:
    return None if values is None else tuple(values)


def _pipeline_settings(settings: TrainingSettings | None, method: str, intra: str):
    """The settings of a 3D search, after its cut search is checked (``zero`` adds ZeRO-3)."""
    if method not in PIPELINE_METHODS:
        raise SettingsError(
            f"--pipeline-method: unknown cut search {method!r} (known: "
            f"{', '.join(PIPELINE_METHODS)})"
        )
    settings = settings or TrainingSettings()
    refuse_auto(settings, "3D plans add recompute in their escalation when memory binds")
    return replace(settings, zero=3) if intra == "zero" else settings


def _default_mesh(profile: MachineProfile, devices: int | None) -> str:
    """``node=devices/gpus_per_node,gpu=gpus_per_node`` (one node when the devices fit in one)."""
    if not devices:
        raise SettingsError("--devices: give the device count (or --mesh)")
    per_node = min(profile.gpus_per_node, devices)
    if devices % per_node:
        raise SettingsError(f"--devices: {devices} is not a multiple of {per_node} GPUs per node")
    return f"node={max(1, devices // per_node)},gpu={per_node}"


def evaluate_3d(
    model: str | Graph,
    device: str | MachineProfile = "a100-80g",
    *,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    micro_batch: int = 1,
    batch: int | None = None,
    seq: int | None = None,
    settings: TrainingSettings | None = None,
    schedule: str = "1f1b",
    memory: float | None = None,
    cuts: tuple[int, ...] | None = None,
    fit_required: bool = True,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
) -> Plan3D:
    """Cost a Megatron-style 3D configuration through the 3D search pinned to it: mesh
    ``pp=P,dp=D,tp=T`` (tensor parallelism innermost, inside the node when it fits), Megatron's
    tensor-parallel plan (or data parallelism when tp = 1) in every stage, ``batch / (dp *
    micro_batch)`` micro-batches (with pp = 1: gradient accumulation), even layer split unless
    ``cuts`` are given. No recompute or ZeRO is added. Raises ``InfeasibleError`` if it does not
    fit, unless ``fit_required`` is off (then the plan is returned marked as not fitting)."""
    global_batch = _megatron_batch(model, batch, seq, tp, pp, dp, micro_batch)
    mesh = ",".join(
        [f"pp={pp}"] + [f"{name}={size}" for name, size in (("dp", dp), ("tp", tp)) if size > 1]
    )
    result = plan_pipeline(
        model,
        mesh,
        device,
        batch=global_batch,
        seq=seq,
        memory=memory,
        settings=settings,
        schedule=schedule,
        method="even",
        intra="megatron" if tp > 1 else "dp",
        degrees=[pp],
        counts=[global_batch // (dp * micro_batch)],
        cuts=cuts,
        escalate=False,
        fit_required=fit_required,
        hardware_csv=hardware_csv,
    )
    _refuse_idle_axes(result, dp, tp)
    return replace(_as_given(result), notes=replicated_linears(result, tp))


def _as_given(result: Plan3D) -> Plan3D:
    """A configuration costed as given says GIVEN (as a flat ``evaluate`` does): its even cuts and
    Megatron stage plan are the configuration, not a search's; one that does not fit stays
    INFEASIBLE."""
    if not result.found:
        return result
    return replace(result, pipeline=replace(result.pipeline, status="GIVEN"), intra_status="GIVEN")


def _megatron_batch(model, batch, seq, tp: int, pp: int, dp: int, micro_batch: int) -> int:
    """The global batch of a Megatron-style configuration, its degrees checked against it."""
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("micro-batch", micro_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SettingsError(f"--{name}: must be a positive integer, got {value!r}")
    global_batch = _global_batch(model, batch, seq)
    if global_batch % (dp * micro_batch):
        raise SettingsError(
            f"--batch: global batch {global_batch} is not divisible by dp x micro-batch ({dp} x "
            f"{micro_batch})"
        )
    return global_batch


def _refuse_idle_axes(result: Plan3D, dp: int, tp: int) -> None:
    """A data- or tensor-parallel degree that splits no operator is a configuration error."""
    for k, axis in enumerate(result.stage_mesh_names):
        if axis in ("dp", "tp") and not any(
            strategy[k] is not None for *_, strategy in result.operators
        ):
            sizes = "the micro-batch" if axis == "dp" else "heads, ffn or vocabulary"
            raise SettingsError(
                f"--{axis}: {dict(dp=dp, tp=tp)[axis]} splits nothing in {result.model} (it "
                f"divides none of {sizes}); choose a degree that divides them"
            )


def layer_chain(
    model: str | Graph,
    mesh: str | Mesh,
    device: str | MachineProfile = "a100-80g",
    *,
    stages: int = 4,
    batch: int | None = None,
    seq: int | None = None,
    settings: TrainingSettings | None = None,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
) -> StageChain:
    """The layer chain of a model (a spec or a ``Graph``) for ``stages`` pipeline stages over the
    outer part of the mesh: the exact intra-operator plan on the stage sub-mesh, re-costed at every
    micro-batch count that divides the batch (see ``planner.pipeline.threed``).
    ``StageChain.cost(cuts, num_microbatches)`` costs given cuts and a count on it."""
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise SettingsError(f"stages: a positive integer, got {stages!r}")
    # a chain has no memory limit; a Cluster keeps its own (none was given here)
    unlimited = None if isinstance(mesh, Cluster) else float("inf")
    cluster = make_cluster(mesh, device, unlimited, hardware_csv=hardware_csv)
    load = model_loader(model, seq)
    global_batch = _global_batch(model, batch, seq)
    sub = threed.stage_mesh(cluster.mesh, stages)
    found = degree_search.stage_chain(
        load,
        cluster.mesh,
        sub,
        cluster.profile,
        global_batch,
        settings or TrainingSettings(),
        stages,
        threed.divisors(global_batch),
    )
    if found is None:
        raise SettingsError(f"--batch: no micro-batch count keeps the stage plan valid for {model}")
    chain, status, strategies, graph = found
    return StageChain(chain, stages, status, strategies, graph)


def evaluate_3d_file(
    data: dict,
    model: str,
    device: str | MachineProfile = "a100-80g",
    *,
    batch: int | None = None,
    seq: int | None = None,
    settings: TrainingSettings | None = None,
    memory: float | None = None,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
    where: str = "--plan",
) -> Plan3D:
    """Re-cost a 3D plan JSON (``planner-3d/1`` or ``/2``) through the 3D search's chain and
    evaluator."""
    stages, count, schedule, cuts = pipeline_fields(data["pipeline"], where)
    cluster = make_cluster(data["mesh"], device, memory, hardware_csv=hardware_csv)
    load = model_loader(model, seq)
    global_batch = _global_batch(model, batch, seq)
    if global_batch % count:
        raise SettingsError(
            f"{where}: num_microbatches {count} does not divide the batch {global_batch}"
        )
    stage_spec = data["pipeline"].get("stage_mesh")
    sub = threed.stage_mesh(cluster.mesh, stages, stage_spec)
    settings = settings or TrainingSettings()
    refuse_auto(settings, "a 3D plan file fixes one recompute mode")
    problem = build_problem(load(global_batch // count), sub, cluster.profile, settings)
    chosen = strategies_from_mapping(
        problem, {o["name"]: o["strategy"] for o in data["operators"]}, where=where
    )
    strategies = {t.op.name: s for t, s in zip(problem.ops, chosen)}
    return threed.recost(
        load,
        cluster.mesh,
        cluster.profile,
        global_batch,
        settings,
        cluster.memory_limit,
        stages,
        cuts,
        count,
        schedule,
        strategies,
        str(data.get("intra_method", "given")),
        stage_spec,
    )


def refuse_auto(settings: TrainingSettings, why: str) -> None:
    """Refuse 'auto' recompute or ZeRO (a per-layer search) in a 3D plan; recompute given per
    layer (``layer_recompute``: Megatron-LM's block recompute) is a fixed setting and is kept."""
    fixed = {"recompute": bool(settings.layer_recompute), "zero": False}
    for option, value in (("recompute", settings.recompute), ("zero", settings.zero)):
        if value == AUTO and not fixed[option]:
            raise SettingsError(
                f"--{option} auto: not for pipeline plans ({why}); give a fixed --{option}"
            )
