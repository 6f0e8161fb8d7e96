"""Pipeline searches over stage cuts and the micro-batch count on a ``LayerChain``.

Exact references: ``exact_dp`` (Alpa's formulation: enumerate the bottleneck value, minimise the
rest by a DP over (stages, layers); prune when (M-1) * bottleneck exceeds the best) and
``brute_force``. ``csimd`` is the heuristic of record (see its docstring); ``even_split`` and
``balanced`` are the baselines; ``given_cuts`` costs pinned cuts.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Sequence

import numpy as np

from planner.errors import SettingsError
from planner.pipeline.schedule import Evaluator, LayerChain, PipelinePlan, make_result


def brute_force(
    chain: LayerChain, stages: int, schedule: str = "1f1b", memory_limit: float = math.inf
) -> PipelinePlan:
    """Every composition of the layers into ``stages`` parts, every micro-batch count."""
    start = time.perf_counter()
    ev = Evaluator(chain, stages, schedule, memory_limit)
    best: tuple[float, tuple[int, ...], int] | None = None
    for cuts in itertools.combinations(range(1, chain.num_layers), stages - 1):
        for m in range(len(chain.counts)):
            value = ev.objective(cuts, m)
            if value < math.inf and (best is None or value < best[0]):
                best = (value, cuts, m)
    return make_result(ev, "brute", best[1] if best else None, best[2] if best else None, start)


def _dp_at(ev: Evaluator, m: int, bottleneck: float) -> tuple[float, tuple[int, ...]] | None:
    """Least sum of stage times / v (+ stage-0 sync) with every stage <= bottleneck and fitting
    memory.

    DP over (stages k, layers end): best[k, end] = min_begin best[k-1, begin] + T(begin, end),
    vectorised over (begin, end) with the count's span tables (``Evaluator.spans``); ties go to
    the smallest begin.
    """
    ev.evaluations += 1  # for the DP, one evaluation is one (stages x layers) table
    layers, p = ev.chain.num_layers, ev.stages
    seconds, fits = ev.spans(m)
    best = np.full((p + 1, layers + 1), math.inf)
    arg = np.zeros((p + 1, layers + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for k in range(1, p + 1):
        ends = np.arange(k, layers - (p - k) + 1)
        t = seconds[:, ends]
        value = best[k - 1][:, None] + t / ev.chunks
        if k == 1:
            value = value + ev._sync[ends, m][None, :]
        ok = t <= bottleneck
        if fits is not None:
            ok &= fits[k - 1][:, ends]
        value = np.where(ok, value, math.inf)
        j = np.argmin(value, axis=0)
        best[k, ends], arg[k, ends] = value[j, np.arange(len(ends))], j
    if best[p, layers] == math.inf:
        return None
    return float(best[p, layers]), traced_cuts(arg, p, layers)


def traced_cuts(arg: np.ndarray, stages: int, layers: int) -> tuple[int, ...]:
    """The cuts of a DP's optimum, read back from its argmins (``arg[k, end]``: the first layer
    of stage k's range ending at ``end``)."""
    cuts, end = [], layers
    for k in range(stages, 1, -1):
        end = int(arg[k, end])
        cuts.append(end)
    return tuple(reversed(cuts))


def _one_stage(ev: Evaluator, start: float, method: str = "exact") -> PipelinePlan:
    """The exact plan of a one-stage pipeline: the fastest micro-batch count that fits (the
    smallest on ties)."""
    best = None
    for m in range(len(ev.chain.counts)):
        value = ev.objective((), m)
        if value < math.inf and (best is None or value < best[0]):
            best = (value, m)
    return make_result(ev, method, () if best else None, best[1] if best else None, start)


def exact_dp(
    chain: LayerChain, stages: int, schedule: str = "1f1b", memory_limit: float = math.inf
) -> PipelinePlan:
    """Alpa's exact formulation: for every micro-batch count and every candidate bottleneck value
    (the time of some contiguous layer range), a DP over (stages, layers) minimising the sum of
    stage times under that bottleneck. The smallest feasible candidate is found by bisection
    (feasibility is monotone); candidates above it are scanned in increasing order until
    sum(layer times) / v + (M - 1/v) * bottleneck alone reaches the best plan (no later plan can
    win)."""
    start = time.perf_counter()
    ev = Evaluator(chain, stages, schedule, memory_limit)
    layers = chain.num_layers
    best: tuple[float, tuple[int, ...], int] | None = None
    if stages > layers or stages == 1:  # one stage has no cuts: each count is costed alone
        return make_result(ev, "exact", None, None, start) if stages > 1 else _one_stage(ev, start)
    starts = []
    for m, count in enumerate(chain.counts):
        # the time of every layer range: the bottleneck is one of them
        candidates = np.unique(ev.spans(m)[0][np.triu_indices(layers + 1, 1)])
        unbounded = _dp_at(ev, m, math.inf)
        if unbounded is None:
            continue  # no partition fits in memory at this micro-batch count
        lo, hi = 0, len(candidates) - 1
        while lo < hi:  # smallest feasible bottleneck (feasibility is monotone in the threshold)
            mid = (lo + hi) // 2
            if _dp_at(ev, m, candidates[mid]) is None:
                lo = mid + 1
            else:
                hi = mid
        # unbounded[0], the least sum of stage times, bounds every threshold's sum from below
        starts.append(
            (unbounded[0] + ev.bubble_factor(m) * candidates[lo], m, unbounded[0], candidates[lo:])
        )
    # most promising first
    for bound, m, floor, candidates in sorted(starts, key=lambda x: (x[0], x[1])):
        for bottleneck in candidates:
            if best is not None and floor + ev.bubble_factor(m) * bottleneck >= best[0]:
                break
            found = _dp_at(ev, m, float(bottleneck))
            value = ev.objective(found[1], m)
            if value < math.inf and (best is None or value < best[0]):
                best = (value, found[1], m)
            # the sum cannot shrink further; larger bottlenecks only cost more
            if found[0] <= floor:
                break
    return make_result(ev, "exact", best[1] if best else None, best[2] if best else None, start)


def _greedy_cuts(ev: Evaluator, m: int, bottleneck: float) -> list[int] | None:
    """Pack layers left to right, each stage ending at the furthest layer that keeps it under the
    bottleneck and in memory (stage time is not monotone in its length: a later cut may send a
    smaller activation); None if that needs more than p stages."""
    cuts, begin, k = [], 0, 0
    layers = ev.chain.num_layers
    prefix_t = ev._time[:, m]
    sends = 2.0 * (
        ev.chain.link_latency + ev.chain.activation_bytes[:, m] / ev.chain.link_bandwidth
    )
    sends = np.append(sends[:-1], 0.0)  # the last layer's stage sends nothing
    while begin < layers:
        ends = np.arange(begin + 1, layers + 1)
        ok = prefix_t[ends] - prefix_t[begin] + sends[ends - 1] <= bottleneck
        if math.isfinite(ev.memory_limit):
            ok &= ev.stage_memory(k, begin, ends, m) <= ev.memory_limit
        feasible = np.flatnonzero(ok)
        if not len(feasible):
            return None
        end = int(ends[feasible[-1]])
        if end < layers:
            cuts.append(end)
        begin, k = end, k + 1
        if k > ev.stages:
            return None
    return cuts if len(cuts) <= ev.stages - 1 else None


def _fill_stages(ev: Evaluator, cuts: list[int], m: int) -> list[int]:
    """Split the longest stages until there are exactly p (every stage keeps at least one layer)."""
    cuts = sorted(cuts)
    while len(cuts) < ev.stages - 1:
        bounds = [0, *cuts, ev.chain.num_layers]
        spans = [
            (ev.stage_time(bounds[k], bounds[k + 1], m), k)
            for k in range(len(bounds) - 1)
            if bounds[k + 1] - bounds[k] > 1
        ]
        _, k = max(spans)
        begin, end = bounds[k], bounds[k + 1]
        split = min(
            range(begin + 1, end),
            key=lambda c: max(ev.stage_time(begin, c, m), ev.stage_time(c, end, m)),
        )
        cuts = sorted(cuts + [split])
    return cuts


def _bisect_cuts(ev: Evaluator, m: int, tolerance: float) -> list[int] | None:
    """Improved multi-dimensional dichotomy: bisection on the bottleneck with greedy feasibility."""
    layers = ev.chain.num_layers
    low = 0.0
    high = ev.stage_time(0, layers, m) + sum(ev.send(i, m) for i in range(layers))
    cuts = _greedy_cuts(ev, m, high)
    if cuts is None:
        return None
    while high - low > tolerance * high:
        mid = 0.5 * (low + high)
        trial = _greedy_cuts(ev, m, mid)
        if trial is None:
            low = mid
        else:
            high, cuts = mid, trial
    return _fill_stages(ev, cuts, m)


def _repair(ev: Evaluator, cuts: list[int], m: int) -> tuple[list[int], float]:
    """Move each cut by one layer while the objective improves."""
    value = ev.objective(cuts, m)
    improved = True
    while improved:
        improved = False
        for k in range(len(cuts)):
            for step in (-1, 1):
                trial = list(cuts)
                trial[k] += step
                lo = trial[k - 1] if k > 0 else 0
                hi = trial[k + 1] if k + 1 < len(trial) else ev.chain.num_layers
                if not lo < trial[k] < hi:
                    continue
                v = ev.objective(trial, m)
                if v < value:
                    cuts, value, improved = trial, v, True
    return cuts, value


def csimd(
    chain: LayerChain,
    stages: int,
    schedule: str = "1f1b",
    memory_limit: float = math.inf,
    tolerance: float = 1e-4,
) -> PipelinePlan:
    """CSIMD: cross-search over the cuts and the micro-batch count.

    (a) Improved multi-dimensional dichotomy at a fixed M: bisection on the bottleneck stage time,
        each probe a greedy left-to-right packing (feasible if it needs <= p stages and every stage
        fits), the packing at the smallest feasible bottleneck split to exactly p stages, then a
        repair pass moving each cut by one layer while the objective improves.
    (b) Cross-search: alternate (a) at fixed M with the best M at fixed cuts until neither changes.
    Reconstruction choices (the published description is silent): the cross-search starts from the
    M whose dichotomy gives the best objective over all candidate M (a dichotomy is cheap: about
    log2(1/tolerance) greedy packings); ties keep the smaller M.
    """
    start = time.perf_counter()
    ev = Evaluator(chain, stages, schedule, memory_limit)
    if stages > chain.num_layers:
        return make_result(ev, "csimd", None, None, start)
    if stages == 1:  # no cuts: the bisection would only re-find each count's one stage
        return _one_stage(ev, start, "csimd")
    candidates = range(len(chain.counts))
    best: tuple[float, list[int], int] | None = None
    for m in candidates:
        cuts = _bisect_cuts(ev, m, tolerance)
        if cuts is not None:
            cuts, value = _repair(ev, cuts, m)
            if best is None or value < best[0]:
                best = (value, cuts, m)
    if best is None:
        return make_result(ev, "csimd", None, None, start)
    while True:
        value, cuts, m = best
        m_best = min(candidates, key=lambda k: (ev.objective(cuts, k), k))
        new_cuts = _bisect_cuts(ev, m_best, tolerance) if m_best != m else None
        if new_cuts is not None:
            new_cuts, new_value = _repair(ev, new_cuts, m_best)
            if new_value >= ev.objective(cuts, m_best):
                new_cuts, new_value = cuts, ev.objective(cuts, m_best)
        else:
            new_cuts, new_value = cuts, ev.objective(cuts, m_best)
        if new_value < value:
            best = (new_value, new_cuts, m_best)
        else:
            break
    return make_result(ev, "csimd", best[1], best[2], start)


def even_split(
    chain: LayerChain,
    stages: int,
    schedule: str = "1f1b",
    memory_limit: float = math.inf,
    balanced: bool = False,
) -> PipelinePlan:
    """Baseline: equal layers per stage (or equal compute when ``balanced``), best micro-batch
    count."""
    start = time.perf_counter()
    ev = Evaluator(chain, stages, schedule, memory_limit)
    layers = chain.num_layers
    if stages > layers:
        return make_result(ev, "balanced" if balanced else "even", None, None, start)
    best = None
    for m in range(len(chain.counts)):
        if balanced:
            prefix = ev._time[:, m]
            targets = [prefix[-1] * k / stages for k in range(1, stages)]
            cuts = [
                int(np.clip(np.searchsorted(prefix, t), k + 1, layers - (stages - k - 1)))
                for k, t in enumerate(targets)
            ]
            cuts = sorted(set(cuts))
            if len(cuts) != stages - 1:
                cuts = [round(layers * k / stages) for k in range(1, stages)]
        else:
            cuts = [round(layers * k / stages) for k in range(1, stages)]
        value = ev.objective(cuts, m)
        if best is None or value < best[0]:
            best = (value, cuts, m)
    return make_result(ev, "balanced" if balanced else "even", best[1], best[2], start)


def given_cuts(
    chain: LayerChain,
    stages: int,
    schedule: str,
    memory_limit: float,
    cuts: Sequence[int],
    num_microbatches: int | None = None,
) -> PipelinePlan:
    """Cost fixed cuts (first layer of stages 1..p-1) at ``num_microbatches`` (None: the chain's
    best micro-batch count for them)."""
    start = time.perf_counter()
    ev = Evaluator(chain, stages, schedule, memory_limit)
    cuts = tuple(int(c) for c in cuts)
    if (
        len(cuts) != stages - 1
        or list(cuts) != sorted(set(cuts))
        or (cuts and not 0 < cuts[0] <= cuts[-1] < chain.num_layers)
    ):
        raise SettingsError(
            f"--cuts: {list(cuts)} are not {stages - 1} increasing layer indices in "
            f"1..{chain.num_layers - 1} (one per stage boundary of {stages} stages)"
        )
    bounds = (0, *cuts, chain.num_layers)
    thinnest = min(bounds[k + 1] - bounds[k] for k in range(stages))
    if thinnest < ev.chunks:
        raise SettingsError(
            f"--schedule: interleaved:{ev.chunks} needs at least {ev.chunks} layers on every "
            f"stage; the cuts {list(cuts)} leave a stage {thinnest}"
        )
    if num_microbatches is not None and num_microbatches not in chain.counts:
        raise SettingsError(
            f"--num-microbatches: {num_microbatches} is not a count of the chain (its counts: "
            f"{', '.join(map(str, chain.counts))})"
        )
    if num_microbatches is not None:
        m = list(chain.counts).index(num_microbatches)
    else:
        m = min(range(len(chain.counts)), key=lambda k: (ev.objective(cuts, k), k))
    return make_result(ev, "given", cuts, m, start)


def stage_breakdown(
    chain: LayerChain, plan: PipelinePlan
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per stage: time per micro-batch (compute, collectives and the send) and memory per device."""
    ev = Evaluator(chain, plan.stages, plan.schedule, math.inf)
    m = chain.counts.index(plan.num_microbatches)
    bounds = (0, *plan.cuts, chain.num_layers)
    times = tuple(ev.stage_time(bounds[k], bounds[k + 1], m) for k in range(plan.stages))
    memory = tuple(ev.stage_memory(k, bounds[k], bounds[k + 1], m) for k in range(plan.stages))
    return times, memory


# Cut searches; "exact" is Alpa's dynamic programme (exact_dp).
METHODS = {
    "csimd": csimd,
    "exact": exact_dp,
    "brute": brute_force,
    "even": even_split,
    "balanced": lambda c, p, s="1f1b", mem=None: even_split(c, p, s, mem, balanced=True),
}
