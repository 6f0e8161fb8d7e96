"""Cost records: per-device volumes (FLOPs, collectives by phase, kind and mesh axis, memory) and
their seconds under a machine profile (no overlap of communication with compute)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.cluster.mesh import Mesh
from planner.cluster.profiles import MachineProfile
from planner.cost.collectives import Collective, collective_seconds


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
        return Memory(self.params + other.params, self.grads + other.grads,
                      self.optimizer + other.optimizer, self.activations + other.activations)


@dataclass(frozen=True, slots=True)
class CostRecord:
    """Symbolic cost of a piece of the plan: per-device FLOPs, collectives, memory."""

    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    comm: tuple[Collective, ...] = ()
    memory: Memory = field(default_factory=Memory)

    def __add__(self, other: "CostRecord") -> "CostRecord":
        return CostRecord(self.fwd_flops + other.fwd_flops, self.bwd_flops + other.bwd_flops,
                          merge_comm(self.comm + other.comm), self.memory + other.memory)

    def comm_bytes(self, kind: str | None = None, axis: int | None = None, phase: str | None = None) -> float:
        return sum(c.nbytes for c in self.comm if (kind is None or c.kind == kind)
                   and (axis is None or c.axis == axis) and (phase is None or c.phase == phase))


def sum_records(records: "list[CostRecord] | tuple[CostRecord, ...]") -> CostRecord:
    """Sum many records at once (one merge of the collectives instead of one per addition)."""
    comm: list[Collective] = []
    fwd = bwd = 0.0
    params = grads = optimizer = activations = 0.0
    for r in records:
        fwd += r.fwd_flops
        bwd += r.bwd_flops
        comm.extend(r.comm)
        m = r.memory
        params, grads, optimizer, activations = (params + m.params, grads + m.grads, optimizer + m.optimizer,
                                                 activations + m.activations)
    return CostRecord(fwd, bwd, merge_comm(tuple(comm)), Memory(params, grads, optimizer, activations))


def merge_comm(comm: tuple[Collective, ...]) -> tuple[Collective, ...]:
    acc: dict[tuple[str, str, int], list[float]] = {}
    for c in comm:
        slot = acc.setdefault((c.phase, c.kind, c.axis), [0.0, 0])
        slot[0] += c.nbytes
        slot[1] += c.count
    return tuple(Collective(p, k, a, n, int(cnt)) for (p, k, a), (n, cnt) in sorted(acc.items()))


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    compute_s: float
    comm_s: float
    comm_by_kind_s: tuple[tuple[str, float], ...]
    comm_by_axis_s: tuple[tuple[str, float], ...]

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s


def seconds(record: CostRecord, mesh: Mesh, profile: MachineProfile) -> float:
    """Estimated time of a cost record (no overlap of communication with compute)."""
    return breakdown(record, mesh, profile).total_s


def breakdown(record: CostRecord, mesh: Mesh, profile: MachineProfile) -> TimeBreakdown:
    compute = profile.compute_weight * (record.fwd_flops + record.bwd_flops) / profile.flops_per_second
    by_kind: dict[str, float] = {}
    by_axis: dict[str, float] = {}
    for c in record.comm:
        axis = mesh.axes[c.axis]
        t = collective_seconds(c.kind, axis.size, axis.bandwidth, axis.latency, c.nbytes, c.count)
        by_kind[c.kind] = by_kind.get(c.kind, 0.0) + t
        by_axis[axis.name] = by_axis.get(axis.name, 0.0) + t
    return TimeBreakdown(compute, sum(by_kind.values()), tuple(sorted(by_kind.items())), tuple(sorted(by_axis.items())))
