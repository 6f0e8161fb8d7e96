"""3D plans: pipeline stages over the outer part of the mesh, intra-operator plans in each stage.

For each pipeline degree p that is an outer part of the mesh (whole outer axes times a divisor of
the next: 1, 2, 4, 8, 16, 32, 64 on node=8,gpu=8; at most the number of layers), the stage meshes
are the mesh less that part and its tensor-parallel factorings (``planner.pipeline.stage_meshes``).
The intra-operator plan is solved once per p and stage mesh (by the exact search, or by the method
the caller passes; Megatron-LM's pattern on a tensor-parallel factoring) at a reference micro-batch
count M_ref = the smallest divisor of the batch >= 2p (again at the largest micro-batch when
batch / M_ref does not divide over the stage's devices and the plan does not fit), then that plan
is re-costed at every candidate micro-batch count M (every divisor of the batch for which the plan
still divides the micro-batch b = batch / M), which gives the layer chain (costs stay symbolic:
nothing is measured). Operators outside layers (embedding, head, loss) join the
first and the last layer. The cut search (CSIMD by default) picks cuts and M; the memory check is
the schedule's (1F1B: stage k holds min(p - k, M) micro-batches). Stages need not hold equal
layer counts: the cut search places every cut, and the ``even`` method gives stage k the layers
round(k L / p) .. round((k+1) L / p) - 1 (96 layers on 35 stages: 26 stages of 3 layers and 9
of 2). Each degree is planned under every combination of sequence parallelism, recompute and ZeRO
stage at least the given ones (unless ``escalate`` is off); the fastest fitting plan over all wins.

A 3D plan's micro-batch b counts the whole stage's samples (Megatron's per replica: b/dp)."""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, replace
from typing import Callable

from planner.cost.recompute import attention_core
from planner.cost.settings import RECOMPUTE, TrainingSettings
from planner.errors import InfeasibleError, SettingsError
from planner.ir.graph import Graph
from planner.cluster.cluster import Cluster
from planner.cluster.mesh import Mesh
from planner.cluster.profiles import MachineProfile
from planner.pipeline.bound import compute_bound, pipeline_factor
from planner.pipeline.layer_costs import layer_of, plan_valid, model_chain
from planner.pipeline.schedule import parse_schedule
from planner.pipeline.variants import check_choices, variants as setting_variants
from planner.pipeline.search import given_cuts
from planner.pipeline.plan3d import Plan3D
from planner.pipeline.degree_search import (
    DegreeSearch,
    StagePlanner,
    assemble,
    exact_stage_plan,
    faster,
    faster_time,
    remembered,
)
from planner.pipeline.stage_meshes import (
    DATA,
    SEARCH,
    candidates as stage_candidates,
    pipeline_degrees,
    stage_mesh,
)
from planner.units import bytes_text
from planner.cost.strategy import Strategy


@dataclass(frozen=True, slots=True)
class PipelineOptions:
    """What a 3D search chooses and what is pinned: the schedule, the cut search (``method``, one of
    ``planner.pipeline.search.METHODS``), the pipeline degrees and micro-batch counts to try
    (None: every divisor), fixed ``cuts`` (one degree only), ``escalate`` (also try sequence
    parallelism, more recompute and higher ZeRO stages), ``fit_required`` and ``admits`` (the plans
    the caller can use; the others are neither returned nor counted as the fastest)."""

    schedule: str = "1f1b"
    method: str = "csimd"
    degrees: tuple[int, ...] | None = None
    counts: tuple[int, ...] | None = None
    cuts: tuple[int, ...] | None = None
    escalate: bool = True
    fit_required: bool = True
    tensor_meshes: bool = True
    # a plan the caller can use (an engine's expressible configurations: planner.launch.plan_for);
    # None: every plan
    admits: Callable[[Plan3D], bool] | None = None
    # the recompute modes the escalation climbs (an engine's own: planner.launch.Target)
    recompute_ladder: tuple[str, ...] = RECOMPUTE
    # exhaustive over the stated space (see ``certified``): OPTIMAL when every solve is proven
    certify: bool = False


# stage planners that pick strategies by a fixed pattern, without the costed tables
PATTERNS = ("megatron-grid", "megatron", "dp")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_pipeline(
    load: Callable[[int], Graph],
    cluster: Cluster,
    batch: int,
    settings: TrainingSettings,
    options: PipelineOptions = PipelineOptions(),
    stage_planner: StagePlanner = exact_stage_plan,
    intra_method: str = "exact",
    progress: Callable[[int, int, str], None] | None = None,
) -> Plan3D:
    """Search the pipeline degree, every stage's intra-operator plan, the cuts and the count on
    ``cluster`` (``options``: what is searched and what is pinned). Raises ``InfeasibleError`` when
    no candidate fits the memory limit, unless ``options.fit_required`` is off: then the first
    candidate is returned, marked as not fitting."""
    start = time.perf_counter()
    mesh, memory_limit, o = cluster.mesh, cluster.memory_limit, options
    # each micro-batch size's graph is built once per search
    load = functools.lru_cache(maxsize=None)(load)
    degrees, counts = _search_space(load, batch, mesh, o.schedule, o.degrees, o.counts, o.cuts)
    search = DegreeSearch(
        load, mesh, cluster.profile, batch, memory_limit, o.schedule,
        "exact" if o.certify else o.method, counts, stage_planner, o.cuts,
        intra_method=intra_method, admits=o.admits,
        bound=_branch_bound(load, cluster, o.schedule, batch, counts), certify=o.certify,
    )  # fmt: skip
    best, first, rows = None, None, []
    progress = progress or (lambda done, total, what: None)
    for done, p in enumerate(degrees):
        progress(done, len(degrees), "pipeline degrees")
        found, fitting = _degree(search, p, settings, o, rows, faster_time(math.inf, best))
        first, best = first or found, faster(best, fitting)
    progress(len(degrees), len(degrees), "pipeline degrees")
    best = best or (None if o.fit_required else first)
    if best is None and not rows and o.admits is not None:
        raise SettingsError(
            "--for: no configuration of this search is one the engine runs as the plan costs "
            "it (see `planner export --help` for what each engine refuses)"
        )
    if best is None:
        raise _nothing_fits(rows, memory_limit)
    # the gap's proof: no configuration of the space beats it (planner.pipeline.bound)
    bound = compute_bound(load(batch), mesh.num_devices, cluster.profile, settings)
    best = replace(best, candidates=tuple(rows), lower_bound_s=bound)
    if o.certify:
        best = certified(best, search.unproven, _pins(o))
    return replace(best, search_time_s=time.perf_counter() - start)


def _pins(o: PipelineOptions) -> tuple[str, ...]:
    """What the caller pinned of the stated space (a certified plan is optimal over the rest)."""
    pinned = (("--pp", o.degrees), ("--num-microbatches", o.counts), ("--cuts", o.cuts))
    return tuple(flag for flag, value in pinned if value is not None) + (
        () if o.escalate else ("the settings (no escalation)",)
    )


def certified(plan: Plan3D, unproven: list, pins: tuple[str, ...] = ()) -> Plan3D:
    """A certified search's plan: OPTIMAL over the stated space when every stage plan of the
    search's own planner was proven, else the plan with a note naming what was not.

        space = { (p, stage mesh, stage plan, settings, M, cuts) :
                  p in the pipeline degrees (outer parts of the mesh, at most the layers);
                  stage mesh in stage_meshes.candidates(p);
                  stage plan in { the exact intra-operator plan at micro-batch batch / M under the
                                  settings, data parallelism, Megatron-LM's plan on the tp axis };
                  settings in the variants (sequence parallelism, the recompute ladder, ZeRO;
                  no sequence parallelism beside data parallelism alone, as Megatron-LM, and no
                  selective recompute on a model without an attention core: it costs as none);
                  M a micro-batch count; cuts any composition of the layers into p stages }

    Exhaustive: every (p, stage mesh, plan family, settings, M) is costed and cut by the exact DP
    (``search.exact_dp``); only branches whose lower bound is not below the best are skipped
    (``planner.pipeline.bound``)."""
    if unproven:
        note = (
            f"not certified: {len(unproven)} stage plan solve(s) proved no optimum (first: "
            f"{unproven[0]}); raise --time-limit"
        )
        return replace(plan, notes=(*plan.notes, note))
    said = (f"certified over the stated space with {', '.join(pins)} pinned",) if pins else ()
    return replace(plan, certified=True, notes=(*plan.notes, *said))


def _branch_bound(load: Callable, cluster: Cluster, schedule: str, batch: int, counts) -> Callable:
    """(settings variant, stages, micro-batch count or None) -> the seconds none of their plans
    beats: the compute bound with the variant's re-runs, times the pipeline's least bubble; at a
    given count M, M times the bound of one micro-batch of batch / M (smaller micro-batches run
    less efficiently; ``planner.pipeline.bound``)."""
    _, chunks = parse_schedule(schedule)
    devices, profile, most = cluster.mesh.num_devices, cluster.profile, max(counts)

    @functools.lru_cache(maxsize=None)
    def by_mode(variant: TrainingSettings, count: int) -> float:
        work = compute_bound(load(batch // count), devices, profile, variant, recompute=True)
        return count * work

    @functools.lru_cache(maxsize=None)  # asked per count, variant and degree, often again
    def bound(variant: TrainingSettings, stages: int, count: int | None = None) -> float:
        plain = replace(variant, zero=0, sequence_parallel=False)  # neither changes compute
        if count is None:
            return by_mode(plain, 1) * pipeline_factor(stages, chunks, most)
        return by_mode(plain, count) * pipeline_factor(stages, chunks, count)

    return bound


def _degree(
    search: DegreeSearch, p: int, settings, o: PipelineOptions, rows: list, beat: float
) -> tuple:
    """Every stage mesh candidate of degree ``p`` (``stage_meshes.candidates``) under its settings
    variants: (the first plan, the fastest that fits); variants whose bound is not below ``beat``
    seconds are skipped."""
    first, best, relaxed = None, None, False
    inert = () if attention_core(search.load(search.batch)) else ("selective",)
    for candidate in stage_candidates(search.mesh, p, o.tensor_meshes):
        own = candidate.plan == SEARCH
        if not own and relaxed and search.intra_method == "exact" and not o.certify:
            # memory does not bind at this degree (see stage_meshes); a fixed pattern's plan is
            # not the fastest on its stage mesh, so beside it every candidate is tried
            break
        sub = candidate.mesh
        variants = setting_variants(settings, sub, o.recompute_ladder) if o.escalate else [settings]
        # selective recompute re-runs the attention core: a model without one (fused attention)
        # costs it exactly as no recompute, which comes first and wins ties; not tried again
        variants = [
            v for v in variants if v.recompute not in inert or v.recompute == settings.recompute
        ]
        if candidate.plan == DATA and not settings.sequence_parallel:
            # no tensor parallelism, no sequence parallelism: Megatron-LM turns it off at tp 1
            # (megatron/training/arguments.py validate_args), and the grid never runs it there
            variants = [v for v in variants if not v.sequence_parallel]
        if candidate.tensor_axis is not None:
            # Megatron-LM's stage plan runs tensor parallelism with sequence parallelism
            variants = [v for v in variants if v.sequence_parallel] or variants
        chosen = candidate.planner(search.stage_planner)
        if not own:
            chosen = remembered(chosen, search.patterns, (candidate.plan, candidate.tensor_axis))
        planned = replace(
            search,
            stage_planner=chosen,
            # the fixed patterns cost only the strategies they pick (``problem.skeleton``)
            costed=own and search.intra_method not in PATTERNS,
            intra_method=search.intra_method if own else candidate.plan,
        )
        found, fitting, unbound = planned.escalated(sub, p, variants, rows, faster_time(beat, best))
        first, best = first or found, faster(best, fitting)
        relaxed = relaxed or (own and unbound)
    return first, best


def _search_space(load, batch: int, mesh: Mesh, schedule: str, degrees, counts, cuts) -> tuple:
    """The pipeline degrees (every outer part of the mesh that leaves each stage's chunks a
    layer) and micro-batch counts (every divisor of the batch) to search, unless given."""
    layers = max(layer_of(load(batch))) + 1
    known = pipeline_degrees(mesh)
    chunks = parse_schedule(schedule)[1]  # interleaved:v: every stage holds v chunks of >= 1 layer
    degrees = degrees or [p for p in known if p * chunks <= layers]
    check_choices(degrees, counts, known, layers, batch, cuts, chunks)
    return degrees, counts or divisors(batch)


def _nothing_fits(rows: list[dict], memory_limit: float) -> InfeasibleError:
    least = min((row["max_memory_bytes"] for row in rows), default=None)
    need = (
        f"the least of any candidate needs {bytes_text(least)} per device, the limit is "
        f"{bytes_text(memory_limit)}; "
        if least is not None and math.isfinite(memory_limit)
        else ""
    )
    return InfeasibleError(
        "--memory: no pipeline degree, micro-batch count or memory-saving variant fits; "
        f"{need}add devices or raise the memory limit"
    )


def recost(
    load: Callable[[int], Graph],
    mesh: Mesh,
    profile: MachineProfile,
    batch: int,
    settings: TrainingSettings,
    memory_limit: float,
    stages: int,
    cuts: tuple[int, ...],
    num_microbatches: int,
    schedule: str,
    strategies: dict[str, Strategy],
    intra_method: str = "given",
    stage_spec: str | None = None,
) -> Plan3D:
    """Cost a fixed 3D plan (a plan JSON read back): same chain and evaluator as the search;
    ``stage_spec``: the plan's stage mesh when it is not the physical one."""
    parse_schedule(schedule)  # a malformed schedule is refused before the model is built
    if batch % num_microbatches:
        raise SettingsError(
            f"--num-microbatches: {num_microbatches} does not divide the batch {batch}"
        )
    sub = stage_mesh(mesh, stages, stage_spec)
    graph = load(batch // num_microbatches)
    if not plan_valid(graph, sub, strategies):
        raise SettingsError(
            f"--plan: field 'operators': the stage plan does not divide the micro-batch of "
            f"{batch // num_microbatches}"
        )
    chain = model_chain(
        load, batch, [num_microbatches], sub, profile, settings, strategies, mesh.axes[0]
    )
    pipe = given_cuts(chain, stages, schedule, memory_limit, cuts)
    return assemble(
        graph,
        mesh,
        sub,
        profile,
        settings,
        chain,
        pipe,
        strategies,
        "GIVEN",
        memory_limit,
        intra_method,
    )
