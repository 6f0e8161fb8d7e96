"""A cluster as the searches see it: a device mesh on a machine profile, with the per-device memory
limit."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from planner.cluster.mesh import Mesh, parse_mesh
from planner.cluster.profiles import DEFAULT_HARDWARE_CSV, MachineProfile, get_profile
from planner.errors import SettingsError


@dataclass(frozen=True, slots=True)
class Cluster:
    """A mesh on a machine profile, with the per-device memory limit (bytes; inf: none, the one
    encoding every search takes)."""

    mesh: Mesh
    profile: MachineProfile
    memory_limit: float

    def __post_init__(self) -> None:
        # built by hand in a script: checked here, not where a search first reads a field
        if not isinstance(self.mesh, Mesh):
            raise SettingsError(
                f"mesh: a Mesh (make_cluster parses a spec such as '2x4'), got {self.mesh!r}"
            )
        if not isinstance(self.profile, MachineProfile):
            raise SettingsError(
                f"profile: a MachineProfile (make_cluster takes a device name), got "
                f"{self.profile!r}"
            )
        checked_limit(self.memory_limit)


def make_cluster(
    mesh: str | Mesh | Cluster,
    device: str | MachineProfile = "a100-80g",
    memory: float | None = None,
    devices: int | None = None,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
) -> Cluster:
    """A mesh spec (``"2x4"``, ``"node=4,gpu=8"``) or ``Mesh`` on a device, with the memory limit
    (bytes; None: the device's budget, its memory less its reserve; inf: none). A ``Cluster`` is
    returned as it is: its device and memory limit are its own, so another ``device``, a
    ``memory`` or ``devices`` beside it is refused."""
    if isinstance(mesh, Cluster):
        return check_given_cluster(mesh, device, memory, devices)
    profile = device if isinstance(device, MachineProfile) else get_profile(device, hardware_csv)
    mesh_obj = mesh if isinstance(mesh, Mesh) else parse_mesh(str(mesh), profile, devices)
    if memory is None:
        limit = math.inf if profile.name == "symbolic" else float(profile.budget_bytes)
    else:
        limit = checked_limit(memory, "--memory", positive=True)
    return Cluster(mesh_obj, profile, limit)


def checked_limit(memory_limit: float, name: str = "memory_limit", positive: bool = False) -> float:
    """A memory limit in its one encoding: a number of bytes (``positive``: above 0, as the
    command line's), inf for none."""
    if (
        isinstance(memory_limit, bool)
        or not isinstance(memory_limit, (int, float))
        or math.isnan(memory_limit)
        or memory_limit < 0
        or (positive and memory_limit == 0)
    ):
        what = "positive" if positive else "non-negative"
        raise SettingsError(
            f"{name}: must be a {what} number of bytes (or inf for no limit), got {memory_limit!r}"
        )
    return float(memory_limit)


def check_given_cluster(cluster: Cluster, device, memory, devices) -> Cluster:
    if memory is not None or devices is not None:
        raise SettingsError(
            f"{'memory' if memory is not None else 'devices'}: the Cluster has its own; give it to "
            "make_cluster instead"
        )
    if device not in ("a100-80g", cluster.profile.name, cluster.profile):
        raise SettingsError(
            f"device: the Cluster is on {cluster.profile.name}, not "
            f"{getattr(device, 'name', device)}"
        )
    return cluster
