"""Pipeline planning on a chain of layers (docs/formulations.md, The pipeline search):
schedules, exact DP, brute force, CSIMD.

A ``LayerChain`` tabulates, for each layer l and each candidate micro-batch size b, its forward +
backward time t_l(b), the bytes of its output activation a_l(b), and its activation memory per
micro-batch m_l(b); plus per-layer static memory (parameters, gradients, optimizer state) and the
data-parallel gradient synchronisation time g_l. A plan is p stages (contiguous layer ranges given
by cuts) and M micro-batches. With T_k = sum_{l in k} t_l(b) + 2 * send(a_last(k)(b)) (activation
forward, its gradient backward; the last stage sends nothing):

    iteration time  T = sum_k T_k / v + (M - 1/v) * max_k T_k + sum_{l in stage 0} g_l
    memory (stage k) = static_k + inflight_k * act_k(b) + max_{l in k} work_l(b) + tied_k,
                       inflight_k = M (GPipe), min(p - k, M) (1F1B),
                       min(p - k, M) * (1 + (p - 1) / (p v)) (interleaved 1F1B)

work_l(b) is what re-running layer l under recompute materialises again (one layer at a time);
tied_k the copy of a parameter that stage k reads but a layer of another stage keeps (the tied
embedding on the last stage), whose gradients the two stages all-reduce once per step.

GPipe and 1F1B have v = 1 and the same time (sum + (M - 1) max); they differ in memory. Interleaved
1F1B (``interleaved:v``, Megatron-LM's schedule) gives each device v model chunks, which divides the
bubble (p - 1) t by v; each micro-batch then crosses v times as many stage boundaries, so a stage
sends 2 v activations per micro-batch (v - 1 on the last stage). The gradient synchronisation of the
first stage is the one on the critical path (stage 0 finishes its last backward last), so it is
added once. The searches over cuts and M are in ``planner.pipeline.search``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from planner.errors import SettingsError

# the cells of one count's span tables an Evaluator keeps (``Evaluator.spans``): 8 bytes of
# seconds and p booleans per layer range; past it (thousands of layers) they are rebuilt per call
SPAN_CELLS = 1 << 25

# interleaved:v has v model chunks per device (default 2)
SCHEDULES = ("gpipe", "1f1b", "interleaved")
DEFAULT_CHUNKS = 2
# the status of a cut search's plan that fits (the others: HEURISTIC); the exact DP and brute force
# are proven equal on random chains (tests/test_pipeline.py)
METHOD_STATUS = {"exact": "OPTIMAL", "brute": "OPTIMAL", "given": "GIVEN"}


def parse_schedule(schedule: str) -> tuple[str, int]:
    """(name, chunks per device) of ``gpipe``, ``1f1b``, ``interleaved`` or ``interleaved:v``."""
    name, colon, chunks = str(schedule).partition(":")
    if name not in SCHEDULES or (colon and name != "interleaved"):
        raise SettingsError(
            f"--schedule: must be one of {', '.join(SCHEDULES)} (interleaved:v for v chunks), got "
            f"{schedule!r}"
        )
    if name != "interleaved":
        return name, 1
    if colon and (
        not chunks.isascii() or not chunks.isdigit() or len(chunks) > 6 or int(chunks) < 2
    ):
        raise SettingsError(
            f"--schedule: interleaved:v needs v >= 2 chunks per device, got {schedule!r}"
        )
    return name, int(chunks) if chunks else DEFAULT_CHUNKS


def point_to_point_seconds(nbytes: float, bandwidth: float, latency: float) -> float:
    """One send of ``nbytes`` between neighbouring stages: a + n/B."""
    return latency + nbytes / bandwidth


@dataclass(frozen=True, slots=True, eq=False)
class LayerChain:
    """Per-layer costs; arrays of shape [layers, len(micro_batches)] unless noted."""

    micro_batches: tuple[int, ...]  # candidate micro-batch sizes b, one per micro-batch count M
    counts: tuple[int, ...]  # the micro-batch count M of each candidate (b = batch / M)
    time: np.ndarray
    activation_bytes: np.ndarray
    activation_memory: np.ndarray
    static_memory: np.ndarray  # [layers]
    # [layers, counts] (or [layers]: the same at every count); exposed per step
    grad_sync: np.ndarray
    link_bandwidth: float
    link_latency: float
    names: tuple[str, ...] = ()
    working_memory: np.ndarray | None = None  # transient bytes of one layer (re-run, loss backward)
    # (owner layer, reader layer, bytes, sync s)
    tied: tuple[tuple[int, int, float, float], ...] = ()
    # [layers, counts, 6]: time per micro-batch by term (timeline.PARTS)
    parts: np.ndarray | None = None
    static_parts: np.ndarray | None = None  # [layers, 3]: params, grads, optimizer bytes
    # [layers, counts]: the part of activation_memory that is the loss's saved softmax (logits)
    logits_memory: np.ndarray | None = None

    def __post_init__(self) -> None:
        layers = self.static_memory.shape[0]
        sync = np.asarray(self.grad_sync, dtype=np.float64)
        if sync.ndim == 1 and sync.shape == (layers,):
            # the part of the sync hidden behind the last micro-batch's backward pass depends on its
            # size, so a chain costed at several sizes carries one column per count
            object.__setattr__(
                self, "grad_sync", np.repeat(sync[:, None], len(self.counts), axis=1)
            )
        elif sync.shape != (layers, len(self.counts)):
            raise SettingsError(
                f"layer chain: field 'grad_sync' must have shape ({layers}, {len(self.counts)})"
            )
        for name in ("time", "activation_bytes", "activation_memory"):
            if getattr(self, name).shape != (layers, len(self.counts)):
                raise SettingsError(
                    f"layer chain: field '{name}' must have shape ({layers}, {len(self.counts)})"
                )
        if layers < 1:
            raise SettingsError("layer chain: needs at least one layer")
        if self.working_memory is not None and self.working_memory.shape != (
            layers,
            len(self.counts),
        ):
            raise SettingsError(
                f"layer chain: field 'working_memory' must have shape ({layers}, "
                f"{len(self.counts)})"
            )
        if self.parts is not None and self.parts.shape[:2] != (layers, len(self.counts)):
            raise SettingsError(
                f"layer chain: field 'parts' must have shape ({layers}, {len(self.counts)}, 6)"
            )
        if any(not (0 <= o < layers and 0 <= r < layers) for o, r, *_ in self.tied):
            raise SettingsError("layer chain: field 'tied' names a layer outside the chain")

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
    # OPTIMAL (exact DP, brute force: the best cuts and count over the chain), HEURISTIC (csimd,
    # even, balanced), GIVEN (the cuts were given), INFEASIBLE (nothing fits the memory limit)
    status: str


@dataclass(slots=True)
class Evaluator:
    """Costs a (cuts, micro-batch candidate) pair; counts evaluations. Prefix sums make it O(p)."""

    chain: LayerChain
    stages: int
    schedule: str
    memory_limit: float  # bytes per device; inf: none
    evaluations: int = 0
    kind: str = field(init=False)
    chunks: int = field(init=False)  # v: model chunks per device (1 unless interleaved)
    _time: np.ndarray = field(init=False)
    _act: np.ndarray = field(init=False)
    _static: np.ndarray = field(init=False)
    _sync: np.ndarray = field(init=False)
    # [M, begin, end]: max working memory of layers [begin, end)
    _work: np.ndarray | None = field(init=False)
    # per count m: the DP's (seconds, fits) tables (``spans``), kept while they are small
    _spans: dict = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.kind, self.chunks = parse_schedule(self.schedule)
        zero_row = np.zeros((1, len(self.chain.counts)))
        self._time = np.vstack([zero_row, np.cumsum(self.chain.time, axis=0)])
        self._act = np.vstack([zero_row, np.cumsum(self.chain.activation_memory, axis=0)])
        self._static = np.concatenate([[0.0], np.cumsum(self.chain.static_memory)])
        self._sync = np.vstack([zero_row, np.cumsum(self.chain.grad_sync, axis=0)])
        self._work = None
        work = self.chain.working_memory
        if work is not None and work.any():
            layers = self.chain.num_layers
            self._work = np.zeros((len(self.chain.counts), layers + 1, layers + 1))
            for begin in range(layers):
                self._work[:, begin, begin + 1 :] = np.maximum.accumulate(work[begin:], axis=0).T

    def send(self, last_layer: int, m: int) -> float:
        nbytes = self.chain.activation_bytes[last_layer, m]
        return 2.0 * point_to_point_seconds(
            nbytes, self.chain.link_bandwidth, self.chain.link_latency
        )

    def stage_time(self, start: int, end: int, m: int) -> float:
        """Layers [start, end) on one stage; sends its output unless it is the last stage."""
        return self._time[end, m] - self._time[start, m] + self.boundary_seconds(end, m)

    def spans(self, m: int) -> tuple[np.ndarray, np.ndarray | None]:
        """At count m, for every layer range [begin, end): ``seconds[begin, end]``, the stage
        time with its sends (inf unless begin < end), and ``fits[k, begin, end]``, whether stage k
        holding it fits in memory (None: no limit). The same sums as ``stage_time`` and
        ``stage_memory``, element by element; the exact DP asks them at every bottleneck it tries,
        so they are kept per count while they hold at most ``SPAN_CELLS`` cells."""
        if m in self._spans:
            return self._spans[m]
        layers = self.chain.num_layers
        span = np.arange(layers + 1)
        sends = np.array([0.0] + [self.boundary_seconds(end, m) for end in span[1:]])
        prefix = self._time[:, m]
        seconds = prefix[None, :] - prefix[:, None] + sends[None, :]
        seconds = np.where(span[:, None] < span[None, :], seconds, math.inf)
        fits = None
        if math.isfinite(self.memory_limit):
            begin, end = span[:, None], span[None, :]
            fits = np.stack(
                [
                    self.stage_memory(k, begin, end, m) <= self.memory_limit
                    for k in range(self.stages)
                ]
            )
        if (self.stages + 1) * seconds.size <= SPAN_CELLS:
            self._spans[m] = (seconds, fits)
        return seconds, fits

    def boundary_seconds(self, end: int, m: int) -> float:
        """Sends of a stage that ends before layer ``end``: v per micro-batch (v - 1 on the last
        stage)."""
        sends = self.chunks if end < self.chain.num_layers else self.chunks - 1
        return sends * self.send(end - 1, m) if sends else 0.0

    def bubble_factor(self, m: int) -> float:
        """The multiple of the bottleneck stage time in the iteration: M - 1/v."""
        return self.chain.counts[m] - 1.0 / self.chunks

    def inflight(self, k, m: int):
        """Micro-batches whose activations stage k holds at its peak (k may be an array)."""
        count = self.chain.counts[m]
        if self.kind == "gpipe":
            return count
        inflight = np.minimum(self.stages - np.asarray(k), count)
        return (
            inflight * (1 + (self.stages - 1) / (self.stages * self.chunks))
            if self.chunks > 1
            else inflight
        )

    def stage_memory(self, k, start, end, m: int):
        """Memory of stage k holding layers [start, end) (any of the three may be an array:
        vectorised): static state, the in-flight micro-batches' activations, the largest working
        set of one layer's re-run, and the copy of a parameter read here but kept by a layer of
        another stage."""
        start, end = np.asarray(start), np.asarray(end)
        act = self._act[end, m] - self._act[start, m]
        memory = self._static[end] - self._static[start] + self.inflight(k, m) * act
        if self._work is not None:
            memory = memory + self._work[m, start, end]
        for owner, reader, nbytes, _ in self.chain.tied:
            memory = memory + np.where(
                _holds(start, end, reader) & ~_holds(start, end, owner), nbytes, 0.0
            )
        return float(memory) if memory.ndim == 0 else memory

    def tied_sync(self, cuts: Sequence[int]) -> float:
        """Gradient sync of parameters whose copies sit on two stages (Megatron's embedding
        all-reduce)."""
        bounds = (0, *cuts, self.chain.num_layers)
        stage = lambda layer: int(np.searchsorted(bounds, layer, side="right")) - 1
        return sum(
            sync for owner, reader, _, sync in self.chain.tied if stage(owner) != stage(reader)
        )

    def fits(self, k: int, start: int, end: int, m: int) -> bool:
        return self.stage_memory(k, start, end, m) <= self.memory_limit

    def cost(self, cuts: Sequence[int], m: int) -> tuple[float, float, float]:
        """(iteration time, bottleneck stage time, max stage memory) of a plan."""
        self.evaluations += 1
        bounds = (0, *cuts, self.chain.num_layers)
        times = [self.stage_time(bounds[k], bounds[k + 1], m) for k in range(self.stages)]
        memory = float(self.stage_memory(np.arange(self.stages), bounds[:-1], bounds[1:], m).max())
        total = (
            sum(times) / self.chunks + self.bubble_factor(m) * max(times) + self._sync[bounds[1], m]
        )
        return total + self.tied_sync(cuts), max(times), memory

    def objective(self, cuts: Sequence[int], m: int) -> float:
        """Iteration time, or infinity when a stage does not fit in memory."""
        total, _, memory = self.cost(cuts, m)
        return total if memory <= self.memory_limit else math.inf


def _holds(start: np.ndarray, end: np.ndarray, layer: int) -> np.ndarray:
    return (start <= layer) & (layer < end)


def make_result(
    ev: Evaluator, method: str, cuts: Sequence[int] | None, m: int | None, start: float
) -> PipelinePlan:
    elapsed = time.perf_counter() - start
    if cuts is None or m is None:
        return PipelinePlan(
            method,
            ev.schedule,
            ev.stages,
            (),
            0,
            0,
            math.inf,
            math.inf,
            math.inf,
            False,
            ev.evaluations,
            elapsed,
            "INFEASIBLE",
        )
    evaluations = ev.evaluations
    total, bottleneck, memory = (float(x) for x in ev.cost(cuts, m))
    fits = bool(memory <= ev.memory_limit)
    return PipelinePlan(
        method,
        ev.schedule,
        ev.stages,
        tuple(int(c) for c in cuts),
        int(ev.chain.counts[m]),
        int(ev.chain.micro_batches[m]),
        total,
        bottleneck,
        memory,
        fits,
        evaluations,
        elapsed,
        METHOD_STATUS.get(method, "HEURISTIC") if fits else "INFEASIBLE",
    )
