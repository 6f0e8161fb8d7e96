"""Device meshes with named axes, each axis with the bandwidth and latency of its link.

Mesh specs: ``8``, ``8x8``, ``4x8x8`` (axes named ``node``/``gpu`` or ``a0``, ``a1``, ...) or
``node=8,gpu=8``. An axis is intra-node (NVLink bandwidth) while the product of it and the axes
after it fits in one node, and inter-node otherwise: at one GPU's NIC when it has one member per
node, as a two-level hierarchy (NVLink, then the NICs) when it has several (``axis_link``). An
unnamed one-axis mesh larger than a node is split into ``node`` and ``gpu`` levels.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from planner.cluster.profiles import MachineProfile
from planner.errors import MeshError


@dataclass(frozen=True, slots=True)
class MeshAxis:
    name: str
    size: int
    bandwidth: float  # bytes/s, one direction, per device
    latency: float  # seconds per ring step

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name or ""):
            raise MeshError(f"--mesh: axis name {self.name!r} is not an identifier")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise MeshError(
                f"--mesh: axis {self.name} needs a positive integer size, got {self.size!r}"
            )
        if not self.bandwidth > 0 or self.latency < 0:
            raise MeshError(
                f"--mesh: axis {self.name} needs positive bandwidth and non-negative latency"
            )


@dataclass(frozen=True, slots=True)
class Mesh:
    """A device mesh: named axes, outermost first."""

    axes: tuple[MeshAxis, ...]

    def __post_init__(self) -> None:
        if not self.axes:
            raise MeshError("--mesh: needs at least one axis")
        names = [a.name for a in self.axes]
        if len(set(names)) != len(names):
            raise MeshError(f"--mesh: axis names repeat: {names}")

    @property
    def num_devices(self) -> int:
        return math.prod(a.size for a in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.axes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def spec(self) -> str:
        return ",".join(f"{a.name}={a.size}" for a in self.axes)

    def sub_mesh(self, sizes: tuple[int, ...]) -> "Mesh":
        """The same axes with smaller sizes (a pipeline stage's share); size-1 axes are dropped."""
        axes = tuple(
            MeshAxis(a.name, s, a.bandwidth, a.latency) for a, s in zip(self.axes, sizes) if s > 1
        )
        return Mesh(
            axes
            or (MeshAxis(self.axes[-1].name, 1, self.axes[-1].bandwidth, self.axes[-1].latency),)
        )


def _parse_sizes(spec: str) -> list[tuple[str | None, int]]:
    if not isinstance(spec, str) or not spec.strip():
        raise MeshError(f"--mesh: empty mesh spec {spec!r}")
    text = spec.replace(" ", "")
    parts = text.split(",") if "=" in text else text.split("x")
    out: list[tuple[str | None, int]] = []
    for part in parts:
        name, _, size = part.rpartition("=") if "=" in part else (None, "", part)
        if not re.fullmatch(r"[0-9]+", size) or int(size) < 1:
            raise MeshError(
                f"--mesh: cannot parse {spec!r} (size {size!r} is not a positive integer; use 8, "
                "8x8 or node=8,gpu=8)"
            )
        out.append((name, int(size)))
    return out


def parse_mesh(spec: str, profile: MachineProfile, devices: int | None = None) -> Mesh:
    """Parse a mesh spec and attach link constants from the profile (innermost axes intra-node).

    A one-axis spec without a name that is larger than a node and a whole number of nodes (``16``
    on 8-GPU nodes) is split into its levels, ``node=2,gpu=8``: its collectives run
    hierarchically, as NCCL runs them, instead of as one ring at one GPU's NIC."""
    sizes = _parse_sizes(spec)
    if all(n is None for n, _ in sizes):
        default = ["node", "gpu"] if len(sizes) == 2 else [f"a{i}" for i in range(len(sizes))]
        names = ["gpu"] if len(sizes) == 1 else default
        sizes = [(n, s) for n, (_, s) in zip(names, sizes)]
        g = profile.gpus_per_node
        if len(sizes) == 1 and sizes[0][1] > g and sizes[0][1] % g == 0:
            sizes = [("node", sizes[0][1] // g), ("gpu", g)]
    elif any(n is None for n, _ in sizes):
        raise MeshError(f"--mesh: {spec!r} mixes named and unnamed axes")
    axes = []
    inner = 1
    for name, size in reversed(sizes):
        bandwidth, latency = axis_link(size, inner, profile)
        axes.append(MeshAxis(name, size, bandwidth, latency))
        inner *= size
    mesh = Mesh(tuple(reversed(axes)))
    if devices is not None and mesh.num_devices != devices:
        raise MeshError(
            f"--mesh: {spec!r} has {mesh.num_devices} devices but --devices is {devices}"
        )
    return mesh


def axis_link(size: int, inner: int, profile: MachineProfile) -> tuple[float, float]:
    """(bandwidth per device, latency per ring step) of an axis of ``size`` devices whose
    neighbours are ``inner`` devices apart (the product of the axes after it).

    Inside a node: NVLink. Spanning nodes with one member per node: the member's own NIC. Spanning
    ``k`` nodes with ``c`` members in each (``inner < gpus_per_node < inner * size``, as ``dp=128``
    beside ``tp=1`` on 8-GPU nodes): the collective runs hierarchically as on a ``node=k,gpu=c``
    mesh (``planner.cost.collectives.hierarchical_all_reduce``): reduce-scatter over NVLink, the
    ``1/c`` shard across nodes at each member's NIC, all-gather over NVLink. The axis carries the
    one bandwidth and latency that give a ring over its ``p = k c`` members that time::

        (p-1)/p / B = (c-1)/c / B_nvlink + (k-1)/(k c) / B_nic
        (p-1) a     = (c-1) a_nvlink + (k-1) a_nic

    so ``evaluate --dp 128`` costs a data-parallel all-reduce as ``--mesh node=16,gpu=8`` does
    (a 1 GiB all-reduce on H100: 9.5 ms, not 45 ms at one NIC)."""
    g = profile.gpus_per_node
    if inner * size <= g:
        return profile.intra_node_bandwidth, profile.intra_node_latency
    c = g // inner if inner < g and g % inner == 0 and size % (g // inner) == 0 else 1
    if c == 1:
        return profile.inter_node_bandwidth, profile.inter_node_latency
    k, p = size // c, size
    seconds_per_byte = (c - 1) / c / profile.intra_node_bandwidth + (k - 1) / (
        k * c
    ) / profile.inter_node_bandwidth
    latency = ((c - 1) * profile.intra_node_latency + (k - 1) * profile.inter_node_latency) / (
        p - 1
    )
    return (p - 1) / p / seconds_per_byte, latency
