"""Pipeline planning on a chain of layers (DESIGN section 7): schedules, exact DP, brute force, CSIMD.

A ``LayerChain`` tabulates, for each layer l and each candidate micro-batch size b, its forward +
backward time t_l(b), the bytes of its output activation a_l(b), and its activation memory per
micro-batch m_l(b); plus per-layer static memory (parameters, gradients, optimizer state) and the
data-parallel gradient synchronisation time g_l. A plan is p stages (contiguous layer ranges given
by cuts) and M micro-batches. With T_k = sum_{l in k} t_l(b) + 2 * send(a_last(k)(b)) (activation
forward, its gradient backward; the last stage sends nothing):

    iteration time  T = sum_k T_k + (M - 1) * max_k T_k + sum_{l in stage 0} g_l
    memory (stage k) = static_k + inflight_k * act_k(b),  inflight_k = M (GPipe), min(p - k, M) (1F1B)

Both schedules have the same time; they differ in memory. The gradient synchronisation of the
first stage is the one on the critical path (stage 0 finishes its last backward last), so it is
added once. Exact references: ``exact_dp`` (Alpa's formulation: enumerate the bottleneck value,
minimise the rest by a DP over (stages, layers); prune when (M-1) * bottleneck exceeds the best)
and ``brute_force``. ``csimd`` is the heuristic of record (see its docstring).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from planner.cost import collective_seconds
from planner.errors import SettingsError

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True, slots=True, eq=False)
class LayerChain:
    """Per-layer costs; arrays of shape [layers, len(micro_batches)] unless noted."""

    micro_batches: tuple[int, ...]  # candidate micro-batch sizes b, one per micro-batch count M
    counts: tuple[int, ...]  # the micro-batch count M of each candidate (b = batch / M)
    time: np.ndarray
    activation_bytes: np.ndarray
    activation_memory: np.ndarray
    static_memory: np.ndarray  # [layers]
    grad_sync: np.ndarray  # [layers]
    link_bandwidth: float
    link_latency: float
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        layers = self.static_memory.shape[0]
        for name in ("time", "activation_bytes", "activation_memory"):
            if getattr(self, name).shape != (layers, len(self.counts)):
                raise SettingsError(f"layer chain: field '{name}' must have shape ({layers}, {len(self.counts)})")
        if layers < 1:
            raise SettingsError("layer chain: needs at least one layer")

    @property
    def num_layers(self) -> int:
        return self.static_memory.shape[0]


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    method: str
    schedule: str
    stages: int
    cuts: tuple[int, ...]  # first layer of stages 1..p-1
    num_microbatches: int
    micro_batch: int
    iteration_time_s: float
    bottleneck_s: float
    max_memory_bytes: float
    fits_memory: bool
    evaluations: int
    search_time_s: float
    status: str = "OK"


@dataclass(slots=True)
class Evaluator:
    """Costs a (cuts, micro-batch candidate) pair; counts evaluations. Prefix sums make it O(p)."""

    chain: LayerChain
    stages: int
    schedule: str
    memory_limit: float | None
    evaluations: int = 0
    _time: np.ndarray = field(init=False)
    _act: np.ndarray = field(init=False)
    _static: np.ndarray = field(init=False)
    _sync: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise SettingsError(f"--schedule: must be one of {SCHEDULES}, got {self.schedule!r}")
        zero_row = np.zeros((1, len(self.chain.counts)))
        self._time = np.vstack([zero_row, np.cumsum(self.chain.time, axis=0)])
        self._act = np.vstack([zero_row, np.cumsum(self.chain.activation_memory, axis=0)])
        self._static = np.concatenate([[0.0], np.cumsum(self.chain.static_memory)])
        self._sync = np.concatenate([[0.0], np.cumsum(self.chain.grad_sync)])

    def send(self, last_layer: int, m: int) -> float:
        nbytes = self.chain.activation_bytes[last_layer, m]
        return 2.0 * collective_seconds("p2p", 2, self.chain.link_bandwidth, self.chain.link_latency, nbytes)

    def stage_time(self, start: int, end: int, m: int) -> float:
        """Layers [start, end) on one stage; sends its output unless it is the last stage."""
        t = self._time[end, m] - self._time[start, m]
        return t + (self.send(end - 1, m) if end < self.chain.num_layers else 0.0)

    def inflight(self, k: int, m: int) -> int:
        count = self.chain.counts[m]
        return count if self.schedule == "gpipe" else min(self.stages - k, count)

    def stage_memory(self, k: int, start: int, end: int, m: int) -> float:
        act = self._act[end, m] - self._act[start, m]
        return self._static[end] - self._static[start] + self.inflight(k, m) * act

    def fits(self, k: int, start: int, end: int, m: int) -> bool:
        return self.memory_limit is None or self.stage_memory(k, start, end, m) <= self.memory_limit

    def cost(self, cuts: Sequence[int], m: int) -> tuple[float, float, float]:
        """(iteration time, bottleneck stage time, max stage memory) of a plan."""
        self.evaluations += 1
        bounds = (0, *cuts, self.chain.num_layers)
        times = [self.stage_time(bounds[k], bounds[k + 1], m) for k in range(self.stages)]
        memory = max(self.stage_memory(k, bounds[k], bounds[k + 1], m) for k in range(self.stages))
        total = sum(times) + (self.chain.counts[m] - 1) * max(times) + self._sync[bounds[1]]
        return total, max(times), memory

    def objective(self, cuts: Sequence[int], m: int) -> float:
        """Iteration time, or infinity when a stage does not fit in memory."""
        total, _, memory = self.cost(cuts, m)
        return total if self.memory_limit is None or memory <= self.memory_limit else math.inf


def _result(ev: Evaluator, method: str, cuts: Sequence[int] | None, m: int | None, start: float) -> PipelinePlan:
    elapsed = time.perf_counter() - start
    if cuts is None or m is None:
        return PipelinePlan(method, ev.schedule, ev.stages, (), 0, 0, math.inf, math.inf, math.inf, False,
                            ev.evaluations, elapsed, "INFEASIBLE")
    evaluations = ev.evaluations
    total, bottleneck, memory = (float(x) for x in ev.cost(cuts, m))
    fits = bool(ev.memory_limit is None or memory <= ev.memory_limit)
    return PipelinePlan(method, ev.schedule, ev.stages, tuple(int(c) for c in cuts), int(ev.chain.counts[m]),
                        int(ev.chain.micro_batches[m]), total, bottleneck, memory, fits, evaluations, elapsed,
                        "OK" if fits else "INFEASIBLE")


def brute_force(chain: LayerChain, stages: int, schedule: str = "1f1b", memory_limit: float | None = None) -> PipelinePlan:
    """Every composition of the layers into ``stages`` parts, every micro-batch count."""
    start = time.perf_counter()
    ev = Evaluator(chain, stages, schedule, memory_limit)
    best: tuple[float, tuple[int, ...], int] | None = None
    for cuts in itertools.combinations(range(1, chain.num_layers), stages - 1):
        for m in range(len(chain.counts)):
            value = ev.objective(cuts, m)
            if value < math.inf and (best is None or value < best[0]):
                best = (value, cuts, m)
    return _result(ev, "brute", best[1] if best else None, best[2] if best else None, start)


def _dp_at(ev: Evaluator, m: int, bottleneck: float) -> tuple[float, tuple[int, ...]] | None:
    """Least sum of stage times (+ stage-0 sync) with every stage <= bottleneck and fitting memory.

    DP over (stages k, layers end): best[k, end] = min_begin best[k-1, begin] + T(begin, end),
    vectorised over ``begin`` with prefix sums.
    """
    ev.evaluations += 1  # for the DP, one evaluation is one (stages x layers) table
    layers, p = ev.chain.num_layers, ev.stages
    prefix_t, prefix_a, prefix_s = ev._time[:, m], ev._act[:, m], ev._static
    best = np.full((p + 1, layers + 1), math.inf)
    arg = np.zeros((p + 1, layers + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for k in range(1, p + 1):
        inflight = ev.inflight(k - 1, m)
        for end in range(k, layers - (p - k) + 1):
            begin = np.arange(k - 1, end)
            t = prefix_t[end] - prefix_t[begin] + (ev.send(end - 1, m) if end < layers else 0.0)
            value = best[k - 1, begin] + t + (ev._sync[end] if k == 1 else 0.0)
            ok = t <= bottleneck
            if ev.memory_limit is not None:
                ok &= prefix_s[end] - prefix_s[begin] + inflight * (prefix_a[end] - prefix_a[begin]) <= ev.memory_limit
            value = np.where(ok, value, math.inf)
            j = int(np.argmin(value))
            best[k, end], arg[k, end] = value[j], begin[j]
    if best[p, layers] == math.inf:
        return None
    cuts, end = [], layers
    for k in range(p, 1, -1):
        end = int(arg[k, end])
        cuts.append(end)
    return float(best[p, layers]), tuple(reversed(cuts))


def exact_dp(chain: LayerChain, stages: int, schedule: str = "1f1b", memory_limit: float | None = None) -> PipelinePlan:
    """Alpa's exact formulation: for every micro-batch count and every candidate bottleneck value
    (the time of some contiguous layer range), a DP over (stages, layers) minimising the sum of
    stage times under that bottleneck. The smallest feasible candidate is found by bisection
    (feasibility is monotone); candidates above it are scanned in increasing order until
    sum(layer times) + (M - 1) * bottleneck alone reaches the best plan (no later plan can win)."""
    start = time.perf_counter()
    ev = Evaluator(chain, stages, schedule, memory_limit)
    layers = chain.num_layers
    best: tuple[float, tuple[int, ...], int] | None = None
    if stages > layers:
        return _result(ev, "exact", None, None, start)
    starts = []
    for m, count in enumerate(chain.counts):
        prefix = ev._time[:, m]
        candidates = np.unique(np.concatenate([
            prefix[j] - prefix[:j] + (ev.send(j - 1, m) if j < layers else 0.0) for j in range(1, layers + 1)]))
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
        starts.append((unbounded[0] + (count - 1) * candidates[lo], m, unbounded[0], candidates[lo:]))
    for bound, m, floor, candidates in sorted(starts, key=lambda x: (x[0], x[1])):  # most promising first
        count = chain.counts[m]
        for bottleneck in candidates:
            if best is not None and floor + (count - 1) * bottleneck >= best[0]:
                break
            found = _dp_at(ev, m, float(bottleneck))
            value = ev.objective(found[1], m)
            if value < math.inf and (best is None or value < best[0]):
                best = (value, found[1], m)
            if found[0] <= floor:  # the sum cannot shrink further; larger bottlenecks only cost more
                break
    return _result(ev, "exact", best[1] if best else None, best[2] if best else None, start)


def _greedy_cuts(ev: Evaluator, m: int, bottleneck: float) -> list[int] | None:
    """Pack layers left to right, each stage ending at the furthest layer that keeps it under the
    bottleneck and in memory (stage time is not monotone in its length: a later cut may send a
    smaller activation); None if that needs more than p stages."""
    cuts, begin, k = [], 0, 0
    layers = ev.chain.num_layers
    prefix_t, prefix_a, prefix_s = ev._time[:, m], ev._act[:, m], ev._static
    sends = 2.0 * (ev.chain.link_latency + ev.chain.activation_bytes[:, m] / ev.chain.link_bandwidth)
    sends = np.append(sends[:-1], 0.0)  # the last layer's stage sends nothing
    while begin < layers:
        ends = np.arange(begin + 1, layers + 1)
        ok = prefix_t[ends] - prefix_t[begin] + sends[ends - 1] <= bottleneck
        if ev.memory_limit is not None:
            ok &= (prefix_s[ends] - prefix_s[begin] + ev.inflight(k, m) * (prefix_a[ends] - prefix_a[begin])
                   <= ev.memory_limit)
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
        spans = [(ev.stage_time(bounds[k], bounds[k + 1], m), k) for k in range(len(bounds) - 1)
                 if bounds[k + 1] - bounds[k] > 1]
        _, k = max(spans)
        begin, end = bounds[k], bounds[k + 1]
        split = min(range(begin + 1, end), key=lambda c: max(ev.stage_time(begin, c, m), ev.stage_time(c, end, m)))
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


def csimd(chain: LayerChain, stages: int, schedule: str = "1f1b", memory_limit: float | None = None,
          tolerance: float = 1e-4) -> PipelinePlan:
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
        return _result(ev, "csimd", None, None, start)
    candidates = range(len(chain.counts))
    best: tuple[float, list[int], int] | None = None
    for m in candidates:
        cuts = _bisect_cuts(ev, m, tolerance)
        if cuts is not None:
            cuts, value = _repair(ev, cuts, m)
            if best is None or value < best[0]:
                best = (value, cuts, m)
    if best is None:
        return _result(ev, "csimd", None, None, start)
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
    return _result(ev, "csimd", best[1], best[2], start)


def even_split(chain: LayerChain, stages: int, schedule: str = "1f1b", memory_limit: float | None = None,
               balanced: bool = False) -> PipelinePlan:
    """Baseline: equal layers per stage (or equal compute when ``balanced``), best micro-batch count."""
    start = time.perf_counter()
    ev = Evaluator(chain, stages, schedule, memory_limit)
    layers = chain.num_layers
    if stages > layers:
        return _result(ev, "balanced" if balanced else "even", None, None, start)
    best = None
    for m in range(len(chain.counts)):
        if balanced:
            prefix = ev._time[:, m]
            targets = [prefix[-1] * k / stages for k in range(1, stages)]
            cuts = [int(np.clip(np.searchsorted(prefix, t), k + 1, layers - (stages - k - 1)))
                    for k, t in enumerate(targets)]
            cuts = sorted(set(cuts))
            if len(cuts) != stages - 1:
                cuts = [round(layers * k / stages) for k in range(1, stages)]
        else:
            cuts = [round(layers * k / stages) for k in range(1, stages)]
        value = ev.objective(cuts, m)
        if best is None or value < best[0]:
            best = (value, cuts, m)
    return _result(ev, "balanced" if balanced else "even", best[1], best[2], start)


def given_cuts(chain: LayerChain, stages: int, schedule: str, memory_limit: float | None,
               cuts: Sequence[int]) -> PipelinePlan:
    """Cost fixed cuts (first layer of stages 1..p-1) at the best micro-batch count of the chain."""
    start = time.perf_counter()
    ev = Evaluator(chain, stages, schedule, memory_limit)
    cuts = tuple(int(c) for c in cuts)
    if len(cuts) != stages - 1 or list(cuts) != sorted(set(cuts)) or (cuts and not 0 < cuts[0] <= cuts[-1] < chain.num_layers):
        raise SettingsError(f"cuts: {list(cuts)} are not {stages - 1} increasing layer indices in 1..{chain.num_layers - 1}")
    m = min(range(len(chain.counts)), key=lambda k: (ev.objective(cuts, k), k))
    return _result(ev, "given", cuts, m, start)


def stage_breakdown(chain: LayerChain, plan: PipelinePlan) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per stage: time per micro-batch (compute, collectives and the send) and memory per device."""
    ev = Evaluator(chain, plan.stages, plan.schedule, None)
    m = chain.counts.index(plan.num_microbatches)
    bounds = (0, *plan.cuts, chain.num_layers)
    times = tuple(ev.stage_time(bounds[k], bounds[k + 1], m) for k in range(plan.stages))
    memory = tuple(ev.stage_memory(k, bounds[k], bounds[k + 1], m) for k in range(plan.stages))
    return times, memory


# Cut searches; "exact" is Alpa's dynamic programme (exact_dp).
METHODS = {"csimd": csimd, "exact": exact_dp, "brute": brute_force, "even": even_split,
           "balanced": lambda c, p, s="1f1b", mem=None: even_split(c, p, s, mem, balanced=True)}
