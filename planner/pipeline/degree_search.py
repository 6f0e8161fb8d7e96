"""One pipeline degree of the 3D search: a stage mesh's plan under each settings variant, its
layer chain at every micro-batch count, the cut search (the even cuts kept where they win), and
the costed 3D plan (``assemble``). ``planner.pipeline.threed`` runs it over the degrees and stage
meshes."""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field, replace
from typing import Callable

from planner.cluster.mesh import Mesh
from planner.cluster.profiles import MachineProfile
from planner.cost.problem import Problem, build_problem, skeleton
from planner.cost.settings import TrainingSettings
from planner.cost.strategy import Strategy
from planner.ir.graph import Graph
from planner.pipeline.layer_costs import layer_of, model_chain
from planner.pipeline.layout import make_layout
from planner.pipeline.plan3d import Plan3D
from planner.pipeline.schedule import Evaluator, LayerChain, PipelinePlan
from planner.pipeline.search import METHODS, given_cuts, stage_breakdown
from planner.pipeline.timeline import stage_details
from planner.search.exact import solve_exact

# a stage problem -> its strategies (in problem order) and the status of their search
StagePlanner = Callable[[Problem], tuple[tuple[Strategy, ...], str]]


def exact_stage_plan(problem: Problem) -> tuple[tuple[Strategy, ...], str]:
    """The default stage planner: the exact intra-operator search without a memory limit."""
    result, _ = solve_exact(problem, math.inf)
    return tuple(t.strategies[c] for t, c in zip(problem.ops, result.choice)), result.status


def faster(best: Plan3D | None, candidate: Plan3D | None) -> Plan3D | None:
    if candidate is None:
        return best
    if best is None or candidate.pipeline.iteration_time_s < best.pipeline.iteration_time_s:
        return candidate
    return best


def remembered(planner: StagePlanner, cache: dict, pattern: tuple) -> StagePlanner:
    """A fixed pattern's stage planner (data parallelism, Megatron-LM's) that reuses what it chose
    for a graph on a stage mesh: its strategies depend on the graph, the mesh and sequence
    parallelism (``search.baselines``), not on the ZeRO stage, recompute or the count's costs."""

    def plan(problem: Problem) -> tuple[tuple[Strategy, ...], str]:
        key = (pattern, id(problem.graph), problem.mesh, problem.settings.sequence_parallel)
        if key not in cache:
            cache[key] = (problem.graph, planner(problem))  # the graph kept: its id stays its own
        return cache[key][1]

    return plan


def faster_time(beat: float, best: Plan3D | None) -> float:
    """The fastest of ``beat`` seconds and ``best``'s iteration time."""
    return min(beat, best.pipeline.iteration_time_s) if best is not None else beat


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
    memory_limit: float = math.inf,
):
    """Plan the stage sub-mesh at the reference micro-batch count (default: the smallest count of
    at least 2p); the plan's layer chain. ``edge_matrices``: a search's cache of redistribution
    matrices (``build_problem``), shared by its settings variants; ``costed`` off: the planner
    reads only the problem's skeleton (Megatron's pattern). A plan whose parameter state alone
    cannot fit ``memory_limit`` under any cuts (``static_overflow``) is costed at the reference
    count only: no count makes it fit."""
    reference = reference or reference_count(counts, p)
    graph = load(batch // reference)
    problem = (
        build_problem(graph, sub, profile, settings, edge_matrices=edge_matrices)
        if costed
        else skeleton(graph, sub, profile, settings)
    )
    chosen, status = stage_planner(problem)
    strategies = {t.op.name: s for t, s in zip(problem.ops, chosen)}
    cost = lambda at: model_chain(
        load, batch, at, sub, profile, settings, strategies, mesh.axes[0], columns_cache
    )
    chain = cost([reference]) if reference in counts and len(counts) > 1 else None
    if chain is None or not static_overflow(chain, p, memory_limit):
        chain = cost(counts)
    return None if chain is None else (chain, status, strategies, graph)


def static_overflow(chain, p: int, memory_limit: float) -> bool:
    """Whether every cut of the chain into ``p`` stages leaves a stage whose parameters, gradients
    and optimizer state alone exceed ``memory_limit``: a stage's memory is at least the static
    memory of its layers, and the fullest of ``p`` stages holds at least the average and at least
    the largest layer (the static state does not depend on the micro-batch count)."""
    static = chain.static_memory
    return max(float(static.sum()) / p, float(static.max())) > memory_limit


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
    # the plans the caller can use (threed.PipelineOptions.admits); None: all
    admits: Callable[[Plan3D], bool] | None = None
    # (settings variant, stages, count or None) -> seconds no plan of them beats
    # (planner.pipeline.bound); None: no pruning
    bound: Callable | None = None
    # exhaustive over the stated space (threed.PipelineOptions.certify): every count's own stage
    # plan, no pruning but by bounds; the stage plans whose solve proved no optimum are listed in
    # ``unproven``
    certify: bool = False
    unproven: list = field(default_factory=list)
    # the fixed patterns' strategies by (pattern, graph, stage mesh, SP) (``remembered``)
    patterns: dict = field(default_factory=dict)

    def degree(
        self, sub: Mesh, settings: TrainingSettings, p: int, fastest: float = math.inf
    ) -> tuple[Plan3D | None, Callable[[], bool]]:
        """The best plan of ``p`` stages on ``sub`` under ``settings`` (None: no stage plan), and
        a call that says whether it fits with the memory limit not binding (a second cut search:
        made only when asked). The stage plan is solved at the
        reference count, then again at the count the cut search picked when that differs (a plan
        solved for micro-batches of 64 can lose 12% at 128: Llama 3 70B on 64 H100s), and the
        faster of the two is kept. Certified: ``_every_count``."""
        if self.certify:
            return self._every_count(sub, settings, p, fastest), lambda: False
        plan, free = self._at(sub, settings, p, None)
        if (plan is None or not plan.fits_memory) and self._unsplit(sub, p):
            # the reference micro-batch is too small to split over the stage's devices, so its
            # plan replicates where data parallelism would fit: solved again at the largest
            again, again_free = self._at(sub, settings, p, self.counts[0])
            if again is not None and again.fits_memory:
                return again, again_free
        count = plan.pipeline.num_microbatches if plan is not None else 0
        if plan is not None and plan.fits_memory and count != reference_count(self.counts, p):
            again, again_free = self._at(sub, settings, p, count)
            if again is not None and again.fits_memory and faster(plan, again) is again:
                return again, again_free
        return plan, free

    def _unsplit(self, sub: Mesh, p: int) -> bool:
        """Whether the reference count's micro-batch does not divide over the stage's devices
        (and a larger micro-batch exists)."""
        reference = reference_count(self.counts, p)
        return reference != self.counts[0] and (self.batch // reference) % sub.num_devices != 0

    def _every_count(
        self, sub: Mesh, settings: TrainingSettings, p: int, fastest: float
    ) -> Plan3D | None:
        """The fastest fitting plan (else the first) over every micro-batch count, each with the
        stage plan solved at that count and a chain of that count alone, so the cut search's
        optimum at each count is over the count's own stage plan; a count whose bound is not
        below the fastest plan so far is skipped."""
        first, best = None, None
        order = self.counts
        if self.bound is not None:  # the most promising count first: the bound prunes more
            order = sorted(self.counts, key=lambda count: self.bound(settings, p, count))
        # ties and the first plan go to the smallest count, whatever the order
        key = lambda plan: (plan.pipeline.iteration_time_s, plan.pipeline.num_microbatches)
        for count in order:
            limit = faster_time(fastest, best)
            if self.bound is not None and self.bound(settings, p, count) >= limit:
                continue
            plan, _ = self._at(sub, settings, p, count, [count])
            if plan is None:
                continue
            if self.costed and plan.intra_status != "OPTIMAL":
                self.unproven.append(f"{p} stages of {sub.spec}, {count} micro-batches")
            if first is None or plan.pipeline.num_microbatches < first.pipeline.num_microbatches:
                first = plan
            if plan.fits_memory and (self.admits is None or self.admits(plan)):
                # only a plan the caller keeps bounds the others
                best = plan if best is None or key(plan) < key(best) else best
        return best or first

    def _at(
        self, sub: Mesh, settings: TrainingSettings, p: int, reference: int | None, counts=None
    ) -> tuple:
        found = stage_chain(
            self.load,
            self.mesh,
            sub,
            self.profile,
            self.batch,
            settings,
            p,
            counts or self.counts,
            self.stage_planner,
            reference,
            self.edge_matrices,
            self.costed,
            self.columns_cache,
            self.memory_limit,
        )
        if found is None or p > found[0].num_layers:
            return None, lambda: False
        chain, status, strategies, graph = found
        pipe = self._cuts(chain, p, self.memory_limit)
        # asked only where a skip depends on it (``escalated``): a second cut search
        free = functools.partial(self._unbound, chain, p, pipe)
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

    def escalated(self, sub: Mesh, p: int, variants, rows: list, beat: float = math.inf) -> tuple:
        """The plans of ``p`` stages under every variant (``variants.variants``: least recompute
        first): (the first plan, the fastest that fits or None, whether a variant of the least
        recompute fits with the memory limit not binding); a row per plan is added to ``rows``. A
        variant with more recompute than one of the same sequence parallelism and ZeRO stage that
        fits without the memory limit binding is skipped: for every stage plan, count and cuts a
        re-run only adds compute, so it cannot be faster. So is a variant whose lower bound is not
        below the fastest plan so far (``beat``, or one of these)."""
        first, best, free, relaxed = None, None, set(), False
        for n, variant in enumerate(variants):
            fastest = faster_time(beat, best)
            skipped = (variant.sequence_parallel, variant.zero) in free and not self.certify
            if skipped or self._beaten(variant, p, fastest):
                continue
            candidate, unbound = self.degree(sub, variant, p, fastest)
            if candidate is None or (self.admits is not None and not self.admits(candidate)):
                continue
            first = first or candidate
            rows.append(_candidate_row(p, sub.spec, self.intra_method, variant, candidate.pipeline))
            if candidate.pipeline.fits_memory:
                best = faster(best, candidate)
            key = (variant.sequence_parallel, variant.zero)
            least = variant.recompute == variants[0].recompute
            later = any((v.sequence_parallel, v.zero) == key for v in variants[n + 1 :])
            if (least or later) and unbound():
                free.add(key)
                relaxed = relaxed or least
        return first, best, relaxed

    def _unbound(self, chain: LayerChain, p: int, pipe: PipelinePlan) -> bool:
        """Whether the plan fits with the memory limit not binding (the certified search skips
        nothing by it, so it does not ask)."""
        return pipe.fits_memory and (
            math.isinf(self.memory_limit)
            or (
                not self.certify
                and self._cuts(chain, p, math.inf).iteration_time_s >= pipe.iteration_time_s
            )
        )

    def _beaten(self, variant: TrainingSettings, p: int, fastest: float) -> bool:
        """Whether no plan of ``variant`` on ``p`` stages can beat ``fastest`` seconds."""
        return self.bound is not None and self.bound(variant, p) >= fastest

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
    in_layers = [strategies[op.name] for op in linear if op.layer is not None]
    axes = tuple((axis.name, axis.size) for axis in sub.axes)
    layout = make_layout(pipe, axes, mesh.names, in_layers, settings)
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
        layout=layout,
    )


def _most_common(values: list) -> object:
    return max(sorted(set(values), key=str), key=values.count) if values else None
