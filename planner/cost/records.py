"""Cost records: per-device volumes (FLOPs, collectives by phase, kind and mesh axis, memory), the
compute seconds of the operators (``planner.cost.compute``) and the communication seconds hidden
behind them, and their total under a machine profile::

    time = fwd_s + bwd_s + opt_s + sum_collectives collective_seconds(c) - hidden_s - hidden_sync_s

Every field is additive over operators (each operator's overlap is resolved when it is costed),
so a plan's time is the sum of its terms and the integer program stays linear."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from planner.cluster.mesh import Mesh
from planner.cluster.profiles import MachineProfile
from planner.cost.collectives import PER_MICROBATCH, Collective, collective_seconds


@dataclass(frozen=True, slots=True)
class Memory:
    params: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations

    def __add__(self, other: "Memory") -> "Memory":
        return Memory(
            self.params + other.params,
            self.grads + other.grads,
            self.optimizer + other.optimizer,
            self.activations + other.activations,
        )


@dataclass(frozen=True, slots=True)
class CostRecord:
    """Symbolic cost of a piece of the plan: per-device FLOPs, collectives, memory; the compute
    seconds of its operators (forward and backward per pass, the optimizer step per training step)
    and the communication seconds that run behind that compute."""

    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    comm: tuple[Collective, ...] = ()
    memory: Memory = field(default_factory=Memory)
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    opt_s: float = 0.0
    # per pass: gathers (ZeRO-3, sequence-parallel re-gathers) behind the compute
    hidden_s: float = 0.0
    hidden_sync_s: float = 0.0  # per step: the gradient reduction behind the (last) backward pass
    rerun_s: float = 0.0  # the part of bwd_s that re-runs the forward (recompute), for pictures

    def __add__(self, other: "CostRecord") -> "CostRecord":
        return sum_records([self, other])

    def comm_bytes(
        self, kind: str | None = None, axis: int | None = None, phase: str | None = None
    ) -> float:
        return sum(
            c.nbytes
            for c in self.comm
            if (kind is None or c.kind == kind)
            and (axis is None or c.axis == axis)
            and (phase is None or c.phase == phase)
        )


def sum_records(records: "list[CostRecord] | tuple[CostRecord, ...]") -> CostRecord:
    """Sum many records at once (one merge of the collectives instead of one per addition)."""
    comm: list[Collective] = []
    totals = dict.fromkeys(_ADDITIVE, 0.0)
    memory = Memory()
    for r in records:
        for name in _ADDITIVE:
            totals[name] += getattr(r, name)
        comm.extend(r.comm)
        memory = memory + r.memory
    return CostRecord(comm=merge_comm(tuple(comm)), memory=memory, **totals)


def accumulated(record: CostRecord, num_microbatches: int) -> CostRecord:
    """A step of ``num_microbatches`` micro-batches (gradient accumulation) from the record of
    one: the passes' FLOPs, compute, re-runs, hidden seconds and collectives repeat (ZeRO-2/3's
    gradient reduce-scatter too, as DeepSpeed and FSDP2 accumulate: sharded), the gradient sync
    and optimizer step (and the sync hidden behind the last backward pass) run once, and memory is
    one micro-batch's (they run one after another)::

        time(M) = M (fwd_s + bwd_s - hidden_s + comm_fwd + comm_bwd + comm_reduce) + opt_s
                  + comm_grad + comm_opt - hidden_sync_s"""
    if num_microbatches == 1:
        return record
    m = num_microbatches
    return CostRecord(
        record.fwd_flops * m,
        record.bwd_flops * m,
        tuple(
            replace(c, nbytes=c.nbytes * m, count=c.count * m) if c.phase in PER_MICROBATCH else c
            for c in record.comm
        ),
        record.memory,
        record.fwd_s * m,
        record.bwd_s * m,
        record.opt_s,
        record.hidden_s * m,
        record.hidden_sync_s,
        record.rerun_s * m,
    )


_ADDITIVE = (
    "fwd_flops",
    "bwd_flops",
    "fwd_s",
    "bwd_s",
    "opt_s",
    "hidden_s",
    "hidden_sync_s",
    "rerun_s",
)


def merge_comm(comm: tuple[Collective, ...]) -> tuple[Collective, ...]:
    acc: dict[tuple[str, str, int], list[float]] = {}
    for c in comm:
        slot = acc.setdefault((c.phase, c.kind, c.axis), [0.0, 0.0])
        slot[0] += c.nbytes
        slot[1] += c.count
    return tuple(Collective(p, k, a, n, cnt) for (p, k, a), (n, cnt) in sorted(acc.items()))


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    """Seconds of a record: compute, communication (all of it, by kind and by axis) and the part of
    the communication hidden behind compute."""

    compute_s: float
    comm_s: float
    comm_by_kind_s: tuple[tuple[str, float], ...]
    comm_by_axis_s: tuple[tuple[str, float], ...]
    hidden_s: float = 0.0
    comm_by_kind_axis_s: tuple[tuple[str, str, float], ...] = ()  # (kind, mesh axis, seconds)

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s - self.hidden_s


def seconds(record: CostRecord, mesh: Mesh, profile: MachineProfile) -> float:
    """Estimated time of a cost record: compute + communication - the communication hidden behind
    compute."""
    return breakdown(record, mesh, profile).total_s


def breakdown(record: CostRecord, mesh: Mesh, profile: MachineProfile) -> TimeBreakdown:
    compute = profile.compute_weight * (record.fwd_s + record.bwd_s + record.opt_s)
    by_kind: dict[str, float] = {}
    by_axis: dict[str, float] = {}
    by_pair: dict[tuple[str, str], float] = {}
    for c in record.comm:
        axis = mesh.axes[c.axis]
        t = collective_seconds(c.kind, axis.size, axis.bandwidth, axis.latency, c.nbytes, c.count)
        by_kind[c.kind] = by_kind.get(c.kind, 0.0) + t
        by_axis[axis.name] = by_axis.get(axis.name, 0.0) + t
        by_pair[(c.kind, axis.name)] = by_pair.get((c.kind, axis.name), 0.0) + t
    return TimeBreakdown(
        compute,
        sum(by_kind.values()),
        tuple(sorted(by_kind.items())),
        tuple(sorted(by_axis.items())),
        profile.compute_weight * profile.overlap_weight * (record.hidden_s + record.hidden_sync_s),
        tuple((kind, axis, t) for (kind, axis), t in sorted(by_pair.items())),
    )
