"""Device meshes with named axes, each axis with the bandwidth and latency of its link.

Mesh specs: ``8``, ``8x8``, ``4x8x8`` (axes named ``node``/``gpu`` or ``a0``, ``a1``, ...) or
``node=8,gpu=8``. An axis is intra-node (NVLink bandwidth) while the product of it and the axes
after it fits in one node, and inter-node (per-GPU network bandwidth) otherwise.
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
    """Parse a mesh spec and attach link constants from the profile (innermost axes intra-node)."""
    sizes = _parse_sizes(spec)
    if all(n is None for n, _ in sizes):
        default = ["node", "gpu"] if len(sizes) == 2 else [f"a{i}" for i in range(len(sizes))]
        names = ["gpu"] if len(sizes) == 1 else default
        sizes = [(n, s) for n, (_, s) in zip(names, sizes)]
    elif any(n is None for n, _ in sizes):
        raise MeshError(f"--mesh: {spec!r} mixes named and unnamed axes")
    axes = []
    inner = 1
    for name, size in reversed(sizes):
        inner *= size
        intra = inner <= profile.gpus_per_node
        axes.append(
            MeshAxis(
                name,
                size,
                profile.intra_node_bandwidth if intra else profile.inter_node_bandwidth,
                profile.intra_node_latency if intra else profile.inter_node_latency,
            )
        )
    mesh = Mesh(tuple(reversed(axes)))
    if devices is not None and mesh.num_devices != devices:
        raise MeshError(
            f"--mesh: {spec!r} has {mesh.num_devices} devices but --devices is {devices}"
        )
    return mesh
