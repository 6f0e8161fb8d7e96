"""Where a pipeline plan's time and memory go: per-stage parts, and one iteration laid out in time.

``stage_details`` splits the cost model's per-stage figures (``Evaluator.stage_time`` and
``stage_memory``) into their terms, each summing back exactly:

    time per micro-batch = forward + backward + recompute + forward comm + backward comm - hidden +
    send
    memory               = params + grads + optimizer + activations (in flight) + working
                           + tied copy

``simulate`` lays out one iteration of a schedule with those durations: every device runs its
schedule's static order of passes (GPipe: all forwards, then all backwards; 1F1B: p - k - 1 warm-up
forwards, then one forward and one backward in turn; interleaved: Megatron-LM's order over v chunks,
micro-batches in groups of p; when p does not divide M, which Megatron-LM refuses, all forwards then
all backwards), each pass starting when its device is free and its dependencies (the same
micro-batch's forward on the previous virtual stage, its backward on the next) are done; then each
stage's gradient synchronisation. A pass's block holds its compute, its exposed collectives (the
stage's hidden seconds taken pro rata from the forward and backward collectives) and its
stage-to-stage send. With identical stages the simulated makespan equals the cost model's ``sum_k
T_k / v + (M - 1/v) max_k T_k + sync`` (tested); with unequal stages the two can differ either way
(the closed form charges every stage's time once and the slowest stage M - 1/v times).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import SettingsError
from planner.pipeline.schedule import Evaluator, LayerChain, PipelinePlan, parse_schedule

# columns of LayerChain.parts
PARTS = ("forward", "backward", "recompute", "forward_comm", "backward_comm", "hidden")
STATIC_PARTS = ("params", "grads", "optimizer")
PASSES = ("forward", "backward", "recompute")


@dataclass(frozen=True, slots=True)
class StageDetail:
    """One stage's time per micro-batch and memory per device, term by term (seconds, bytes)."""

    stage: int
    first_layer: int
    end_layer: int  # one past the last layer
    forward_s: float
    backward_s: float
    recompute_s: float
    forward_comm_s: float
    backward_comm_s: float
    hidden_s: float
    send_s: float  # both directions, all chunks
    grad_sync_s: float  # per step
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    working_bytes: float
    tied_bytes: float
    # not added again: the micro-batches whose activations the stage holds at its peak (its
    # schedule's in-flight count) and the part of activations_bytes that is the loss's logits
    inflight_microbatches: float = 0.0
    logits_bytes: float = 0.0

    @property
    def time_per_microbatch_s(self) -> float:
        return (
            self.forward_s
            + self.backward_s
            + self.recompute_s
            + self.forward_comm_s
            + self.backward_comm_s
            - self.hidden_s
            + self.send_s
        )

    @property
    def memory_bytes(self) -> float:
        return (
            self.params_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.working_bytes
            + self.tied_bytes
        )

    def pass_seconds(self) -> dict[str, tuple[float, float]]:
        """Per pass of one micro-batch (all chunks together): (compute seconds, exposed
        communication seconds incl. its half of the sends)."""
        comm = self.forward_comm_s + self.backward_comm_s
        share = 0.0 if comm <= 0 else self.hidden_s / comm
        return {
            "forward": (self.forward_s, self.forward_comm_s * (1 - share) + self.send_s / 2),
            "backward": (self.backward_s, self.backward_comm_s * (1 - share) + self.send_s / 2),
            "recompute": (self.recompute_s, 0.0),
        }


def stage_details(chain: LayerChain, plan: PipelinePlan) -> tuple[StageDetail, ...]:
    """The per-stage terms of a costed pipeline plan (the chain must carry ``parts``)."""
    if chain.parts is None or chain.static_parts is None:
        raise SettingsError("layer chain: field 'parts' is needed to break stage times into terms")
    ev = Evaluator(chain, plan.stages, plan.schedule, math.inf)
    m = chain.counts.index(plan.num_microbatches)
    bounds = (0, *plan.cuts, chain.num_layers)
    out = []
    for k in range(plan.stages):
        start, end = bounds[k], bounds[k + 1]
        parts = chain.parts[start:end, m].sum(axis=0)
        static = chain.static_parts[start:end].sum(axis=0)
        inflight = float(ev.inflight(k, m))
        act = inflight * float(chain.activation_memory[start:end, m].sum())
        logits = (
            inflight * float(chain.logits_memory[start:end, m].sum())
            if chain.logits_memory is not None
            else 0.0
        )
        work = (
            float(chain.working_memory[start:end, m].max())
            if chain.working_memory is not None
            else 0.0
        )
        tied = sum(
            nbytes
            for owner, reader, nbytes, _ in chain.tied
            if start <= reader < end and not start <= owner < end
        )
        out.append(
            StageDetail(
                k,
                start,
                end,
                *(float(x) for x in parts),
                float(ev.boundary_seconds(end, m)),
                float(chain.grad_sync[start:end, m].sum()),
                *(float(x) for x in static),
                act,
                work,
                float(tied),
                inflight,
                logits,
            )
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Block:
    """One pass of one micro-batch on one chunk of one stage, or a stage's gradient sync
    (``sync``)."""

    stage: int
    chunk: int
    microbatch: int  # -1 for the sync
    kind: str  # forward, backward, recompute, sync
    start_s: float
    compute_s: float
    comm_s: float  # exposed communication, drawn after the compute

    @property
    def end_s(self) -> float:
        return self.start_s + self.compute_s + self.comm_s


def device_order(
    schedule: str, stages: int, num_microbatches: int, stage: int
) -> list[tuple[str, int, int]]:
    """The static order of (pass, micro-batch, chunk) one stage runs (recompute runs inside
    backward)."""
    kind, chunks = parse_schedule(schedule)
    groups = [
        list(range(g, min(g + stages, num_microbatches)))
        for g in range(0, num_microbatches, stages)
    ]
    forwards = [("forward", mb, c) for group in groups for c in range(chunks) for mb in group]
    backwards = [
        ("backward", mb, c) for group in groups for c in reversed(range(chunks)) for mb in group
    ]
    if kind == "gpipe" or (chunks > 1 and num_microbatches % stages):
        return forwards + backwards  # Megatron-LM's interleaved order needs M a multiple of p
    warmup = (
        (stages - stage - 1) if chunks == 1 else (stages - stage - 1) * 2 + (chunks - 1) * stages
    )
    warmup = min(warmup, len(forwards))
    order = forwards[:warmup]
    rest_f, rest_b = forwards[warmup:], list(backwards)
    while rest_f or rest_b:
        if rest_f:
            order.append(rest_f.pop(0))
        if rest_b:
            order.append(rest_b.pop(0))
    return order


def simulate(
    details: tuple[StageDetail, ...], schedule: str, num_microbatches: int, tied_sync_s: float = 0.0
) -> tuple[Block, ...]:
    """Blocks of one iteration (see the module docstring); deterministic, in start order per stage.
    ``tied_sync_s``: the all-reduce of a parameter kept on two stages, after the first stage's
    sync."""
    _, chunks = parse_schedule(schedule)
    p = len(details)
    orders = [device_order(schedule, p, num_microbatches, k) for k in range(p)]
    done: dict[tuple[str, int, int], float] = {}  # (pass, micro-batch, virtual stage) -> end
    free, position, blocks = [0.0] * p, [0] * p, []
    last_virtual = p * chunks - 1
    while any(position[k] < len(orders[k]) for k in range(p)):
        progressed = False
        for k in range(p):
            while position[k] < len(orders[k]):
                kind, mb, chunk = orders[k][position[k]]
                virtual = chunk * p + k
                deps = [("forward", mb, virtual - 1)] if kind == "forward" and virtual > 0 else []
                if kind == "backward":
                    deps = [("forward", mb, virtual)] + (
                        [("backward", mb, virtual + 1)] if virtual < last_virtual else []
                    )
                if any(d not in done for d in deps):
                    break
                start = max([free[k]] + [done[d] for d in deps])
                start = _place(blocks, details[k], k, chunk, mb, kind, start, chunks)
                done[(kind, mb, virtual)] = free[k] = start
                position[k] += 1
                progressed = True
        if not progressed:
            # a bug, not an input
            raise SettingsError(f"--schedule: {schedule} order deadlocks on {p} stages")
    for k, detail in enumerate(details):
        blocks.append(
            Block(
                k,
                0,
                -1,
                "sync",
                free[k],
                0.0,
                detail.grad_sync_s + (tied_sync_s if k == 0 else 0.0),
            )
        )
    return tuple(blocks)


def _place(
    blocks: list,
    detail: StageDetail,
    stage: int,
    chunk: int,
    mb: int,
    kind: str,
    start: float,
    chunks: int,
) -> float:
    """Append the blocks of one pass (a backward under recompute: its re-run forward first); its
    end."""
    seconds = detail.pass_seconds()
    passes = ("recompute", "backward") if kind == "backward" and detail.recompute_s > 0 else (kind,)
    for name in passes:
        compute, comm = seconds[name]
        block = Block(stage, chunk, mb, name, start, compute / chunks, comm / chunks)
        blocks.append(block)
        start = block.end_s
    return start


def makespan(blocks: tuple[Block, ...]) -> float:
    return max((b.end_s for b in blocks), default=0.0)


def bubbles(blocks: tuple[Block, ...], stages: int) -> list[tuple[int, float, float]]:
    """Idle intervals (stage, start, end) inside the iteration: the pipeline bubble of each
    stage."""
    end = makespan(blocks)
    out = []
    for k in range(stages):
        spans = sorted((b.start_s, b.end_s) for b in blocks if b.stage == k and b.end_s > b.start_s)
        cursor = 0.0
        for s, e in spans + [(end, end)]:
            if s > cursor + 1e-12 * max(1.0, end):
                out.append((k, cursor, s))
            cursor = max(cursor, e)
    return out
