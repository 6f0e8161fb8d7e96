"""3D plans: pipeline stages over the outer part of the mesh, intra-operator plans in each stage.

For each pipeline degree p that is an outer part of the mesh (whole outer axes times a divisor of
the next: 1, 2, 4, 8, 16, 32, 64 on node=8,gpu=8; at most the number of layers), the stage meshes
are the mesh less that part and its tensor-parallel factorings (``planner.pipeline.stage_meshes``).
The intra-operator plan is solved once per p and stage mesh (by the exact search, or by the method
the caller passes; Megatron-LM's pattern on a tensor-parallel factoring) at a reference micro-batch
count M_ref = the smallest divisor of the batch >= 2p, then that plan is re-costed at every
candidate micro-batch count M (every divisor of the batch for which the plan still divides the
micro-batch b = batch / M), which gives the layer chain (costs stay symbolic: nothing is
measured). Operators outside layers (embedding, head, loss) join the
first and the last layer. The cut search (CSIMD by default) picks cuts and M; the memory check is
the schedule's (1F1B: stage k holds min(p - k, M) micro-batches). Stages need not hold equal
layer counts: the cut search places every cut, and the ``even`` method gives stage k the layers
round(k L / p) .. round((k+1) L / p) - 1 (96 layers on 35 stages: 26 stages of 3 layers and 9
of 2). Each degree is planned under every combination of sequence parallelism, recompute and ZeRO
stage at least the given ones (unless ``escalate`` is off); the fastest fitting plan over all wins.

A 3D plan's micro-batch b counts the whole stage's samples (Megatron's per replica: b/dp)."""

from __future__ import annotations

import bisect
import functools
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from planner.cost.settings import TrainingSettings
from planner.errors import InfeasibleError, SettingsError
from planner.search.exact import solve_exact
from planner.ir.graph import Graph
from planner.cluster.cluster import Cluster
from planner.cluster.mesh import Mesh
from planner.cluster.profiles import MachineProfile
from planner.pipeline.layer_costs import layer_of, plan_valid, model_chain
from planner.pipeline.schedule import Evaluator, LayerChain, PipelinePlan, parse_schedule
from planner.pipeline.timeline import stage_details
from planner.pipeline.variants import check_choices, variants as setting_variants
from planner.pipeline.search import METHODS, given_cuts, stage_breakdown
from planner.cost.problem import Problem, build_problem, skeleton
from planner.pipeline.plan3d import Plan3D
from planner.pipeline.stage_meshes import (
    SEARCH,
    candidates as stage_candidates,
    pipeline_degrees,
    stage_mesh,
)
from planner.units import bytes_text
from planner.cost.strategy import Strategy

# a stage problem -> its strategies (in problem order) and the status of their search
StagePlanner = Callable[[Problem], tuple[tuple[Strategy, ...], str]]


@dataclass(frozen=True, slots=True)
class PipelineOptions:
    """What a 3D search chooses and what is pinned: the schedule, the cut search (``method``, one of
    ``planner.pipeline.search.METHODS``), the pipeline degrees and micro-batch counts to try
    (None: every divisor), fixed ``cuts`` (one degree only), ``escalate`` (also try sequence
    parallelism, more recompute and higher ZeRO stages) and ``fit_required``."""

    schedule: str = "1f1b"
    method: str = "csimd"
    degrees: tuple[int, ...] | None = None
    counts: tuple[int, ...] | None = None
    cuts: tuple[int, ...] | None = None
    escalate: bool = True
    fit_required: bool = True
    tensor_meshes: bool = True


def exact_stage_plan(problem: Problem) -> tuple[tuple[Strategy, ...], str]:
    """The default stage planner: the exact intra-operator search without a memory limit."""
    result, _ = solve_exact(problem, math.inf)
    return tuple(t.strategies[c] for t, c in zip(problem.ops, result.choice)), result.status


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
        load,
        mesh,
        cluster.profile,
        batch,
        memory_limit,
        o.schedule,
        o.method,
        counts,
        stage_planner,
        o.cuts,
        intra_method=intra_method,
    )
    best, first, rows = None, None, []
    progress = progress or (lambda done, total, what: None)
    for done, p in enumerate(degrees):
        progress(done, len(degrees), "pipeline degrees")
        relaxed = False
        for candidate in stage_candidates(mesh, p, o.tensor_meshes):
            own = candidate.plan == SEARCH
            if not own and relaxed:
                break  # memory does not bind at this degree: see stage_meshes
            sub = candidate.mesh
            variants = setting_variants(settings, sub) if o.escalate else [settings]
            if candidate.tensor_axis is not None:
                # Megatron-LM's stage plan runs tensor parallelism with sequence parallelism
                variants = [v for v in variants if v.sequence_parallel] or variants
            planned = replace(
                search,
                stage_planner=candidate.planner(stage_planner),
                costed=own,
                intra_method=intra_method if own else candidate.plan,
            )
            found, fitting, unbound = planned.escalated(sub, p, variants, rows)
            first, best = first or found, _faster(best, fitting)
            relaxed = relaxed or (own and unbound)
    progress(len(degrees), len(degrees), "pipeline degrees")
    best = best or (None if o.fit_required else first)
    if best is None:
        raise _nothing_fits(rows, memory_limit)
    best = replace(best, candidates=tuple(rows))
    return replace(best, search_time_s=time.perf_counter() - start)


def _search_space(load, batch: int, mesh: Mesh, schedule: str, degrees, counts, cuts) -> tuple:
    """The pipeline degrees (every divisor of the outer axis that leaves each stage's chunks a
    layer) and micro-batch counts (every divisor of the batch) to search, unless given."""
    layers = max(layer_of(load(batch))) + 1
    known = pipeline_degrees(mesh)
    chunks = parse_schedule(schedule)[1]  # interleaved:v: every stage holds v chunks of >= 1 layer
    degrees = degrees or [p for p in known if p * chunks <= layers]
    check_choices(degrees, counts, known, layers, batch, cuts, chunks)
    return degrees, counts or divisors(batch)


def _faster(best: Plan3D | None, candidate: Plan3D | None) -> Plan3D | None:
    if candidate is None:
        return best
    if best is None or candidate.pipeline.iteration_time_s < best.pipeline.iteration_time_s:
        return candidate
    return best


def _candidate_row(stages: int, stage_mesh: str, stage_plan: str, variant, pipe) -> dict:
    """One row of the candidates a 3D search compared (``Plan3D.candidates``)."""
    return {
        "stages": stages,
        "stage_mesh": stage_mesh,
        "stage_plan": stage_plan,
        "sequence_parallel": variant.sequence_parallel,
        "recompute": variant.recompute,
        "zero": variant.zero,
        "num_microbatches": pipe.num_microbatches,
        "iteration_time_s": pipe.iteration_time_s,
        "max_memory_bytes": pipe.max_memory_bytes,
        "fits_memory": pipe.fits_memory,
    }


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


def reference_count(counts: list[int], p: int) -> int:
    """The micro-batch count a stage plan is first solved at: the smallest of at least 2p."""
    return next((c for c in counts if c >= 2 * p), counts[-1])


def stage_chain(
    load,
    mesh,
    sub,
    profile,
    batch,
    settings,
    p,
    counts,
    stage_planner: StagePlanner = exact_stage_plan,
    reference: int | None = None,
    edge_matrices: dict | None = None,
    costed: bool = True,
    columns_cache: dict | None = None,
):
    """Plan the stage sub-mesh at the reference micro-batch count (default: the smallest count of
    at least 2p); the plan's layer chain. ``edge_matrices``: a search's cache of redistribution
    matrices (``build_problem``), shared by its settings variants; ``costed`` off: the planner
    reads only the problem's skeleton (Megatron's pattern)."""
    reference = reference or reference_count(counts, p)
    graph = load(batch // reference)
    problem = (
        build_problem(graph, sub, profile, settings, edge_matrices=edge_matrices)
        if costed
        else skeleton(graph, sub, profile, settings)
    )
    chosen, status = stage_planner(problem)
    strategies = {t.op.name: s for t, s in zip(problem.ops, chosen)}
    chain = model_chain(
        load, batch, counts, sub, profile, settings, strategies, mesh.axes[0], columns_cache
    )
    return None if chain is None else (chain, status, strategies, graph)


@dataclass(frozen=True, slots=True)
class DegreeSearch:
    """What the search of one pipeline degree needs beside the degree, its stage mesh and its
    settings: the model's loader, the cluster, the batch, the memory limit, the schedule, the cut
    search (``method``, or the given ``cuts``), the micro-batch counts and the stage planner."""

    load: Callable[[int], Graph]
    mesh: Mesh
    profile: MachineProfile
    batch: int
    memory_limit: float
    schedule: str
    method: str
    counts: list[int]
    stage_planner: StagePlanner
    cuts: tuple[int, ...] | None
    # redistribution matrices built so far: the settings variants of a degree share them
    edge_matrices: dict = field(default_factory=dict)
    # whether the stage planner needs the costed problem (Megatron's pattern does not)
    costed: bool = True
    # per-count layer costs built so far (``layer_costs.model_chain``)
    columns_cache: dict = field(default_factory=dict)
    # the stage planner's name, as plans and candidate rows report it
    intra_method: str = "exact"

    def degree(self, sub: Mesh, settings: TrainingSettings, p: int) -> tuple[Plan3D | None, bool]:
        """The best plan of ``p`` stages on ``sub`` under ``settings`` (None: no stage plan), and
        whether it fits with the memory limit not binding. The stage plan is solved at the
        reference count, then again at the count the cut search picked when that differs (a plan
        solved for micro-batches of 64 can lose 12% at 128: Llama 3 70B on 64 H100s), and the
        faster of the two is kept."""
        plan, free = self._at(sub, settings, p, None)
        count = plan.pipeline.num_microbatches if plan is not None else 0
        if plan is not None and plan.fits_memory and count != reference_count(self.counts, p):
            again, again_free = self._at(sub, settings, p, count)
            if again is not None and again.fits_memory and _faster(plan, again) is again:
                return again, again_free
        return plan, free

    def _at(self, sub: Mesh, settings: TrainingSettings, p: int, reference: int | None) -> tuple:
        found = stage_chain(
            self.load,
            self.mesh,
            sub,
            self.profile,
            self.batch,
            settings,
            p,
            self.counts,
            self.stage_planner,
            reference,
            self.edge_matrices,
            self.costed,
            self.columns_cache,
        )
        if found is None or p > found[0].num_layers:
            return None, False
        chain, status, strategies, graph = found
        pipe = self._cuts(chain, p, self.memory_limit)
        free = pipe.fits_memory and (
            math.isinf(self.memory_limit)
            or self._cuts(chain, p, math.inf).iteration_time_s >= pipe.iteration_time_s
        )
        if (
            pipe.status == "INFEASIBLE"
            and not pipe.fits_memory
            and math.isinf(pipe.iteration_time_s)
        ):
            pipe = self._cuts(chain, p, math.inf)  # report the unconstrained plan as not fitting
            fits = pipe.max_memory_bytes <= self.memory_limit
            pipe = replace(pipe, fits_memory=fits, status="INFEASIBLE")
        mesh, profile, limit = self.mesh, self.profile, self.memory_limit
        plan = assemble(
            graph,
            mesh,
            sub,
            profile,
            settings,
            chain,
            pipe,
            strategies,
            status,
            limit,
            self.intra_method,
        )
        return plan, free

    def escalated(self, sub: Mesh, p: int, variants, rows: list) -> tuple:
        """The plans of ``p`` stages under every variant (``variants.variants``: least recompute
        first): (the first plan, the fastest that fits or None, whether a variant of the least
        recompute fits with the memory limit not binding); a row per plan is added to ``rows``. A
        variant with more recompute than one of the same sequence parallelism and ZeRO stage that
        fits without the memory limit binding is skipped: for every stage plan, count and cuts a
        re-run only adds compute, so it cannot be faster."""
        first, best, free, relaxed = None, None, set(), False
        for variant in variants:
            if (variant.sequence_parallel, variant.zero) in free:
                continue
            candidate, unbound = self.degree(sub, variant, p)
            if candidate is None:
                continue
            first = first or candidate
            rows.append(_candidate_row(p, sub.spec, self.intra_method, variant, candidate.pipeline))
            if candidate.pipeline.fits_memory:
                best = _faster(best, candidate)
            if unbound:
                free.add((variant.sequence_parallel, variant.zero))
                relaxed = relaxed or variant.recompute == variants[0].recompute
        return first, best, relaxed

    def _cuts(self, chain: LayerChain, p: int, limit: float) -> PipelinePlan:
        """The cut search's plan, or the even split where that fits and is faster (a heuristic
        cut search must not lose to the cuts a practitioner writes by hand)."""
        if self.cuts is not None:
            return given_cuts(chain, p, self.schedule, limit, self.cuts)
        found = METHODS[self.method](chain, p, self.schedule, limit)
        if p == 1 or self.method == "even":
            return found
        even = METHODS["even"](chain, p, self.schedule, limit)
        if even.fits_memory and (
            not found.fits_memory or even.iteration_time_s < found.iteration_time_s
        ):
            return even
        return found


def assemble(
    graph: Graph,
    mesh: Mesh,
    sub: Mesh,
    profile: MachineProfile,
    settings: TrainingSettings,
    chain: LayerChain,
    pipe: PipelinePlan,
    strategies: dict[str, Strategy],
    status: str,
    memory_limit: float,
    intra_method: str = "exact",
) -> Plan3D:
    """A Plan3D from a costed pipeline: per-stage time and memory, each operator's stage and
    strategy."""
    times, memory = (tuple(float(x) for x in values) for values in stage_breakdown(chain, pipe))
    layer = layer_of(graph)
    ops = tuple(
        (op.name, op.kind, bisect.bisect_right(pipe.cuts, layer[i]), tuple(strategies[op.name]))
        for i, op in enumerate(graph.operators)
    )
    linear = [op for op in graph.operators if op.kind == "linear"]
    tp = tuple(
        (axis.name, _most_common([strategies[op.name][k] for op in linear]))
        for k, axis in enumerate(sub.axes)
    )
    tied_sync = Evaluator(chain, pipe.stages, pipe.schedule, math.inf).tied_sync(pipe.cuts)
    return Plan3D(
        graph.name,
        mesh.spec,
        profile.name,
        pipe,
        sub.spec,
        settings,
        intra_method,
        status,
        tp,
        ops,
        times,
        memory,
        None if math.isinf(memory_limit) else memory_limit,  # JSON null: no limit
        stage_details=stage_details(chain, pipe),
        tied_sync_s=float(tied_sync),
        operator_layers=tuple(op.layer for op in graph.operators),
        reserve_bytes=profile.reserve_bytes,
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


def _most_common(values: list) -> object:
    return max(sorted(set(values), key=str), key=values.count) if values else None
