"""The stage meshes a 3D search tries for p pipeline stages, and the stage planner of each.

    physical(p)  = the mesh with its outermost axis divided by p        (each axis on its own link)
    tensor(p, t) = physical(p) with its innermost axis r factored as (r / t, t) for t | r, t > 1;
                   the t axis is named ``tp`` and both keep the innermost axis's link (t = r: the
                   innermost axis itself, no factoring)

    candidates(p) = { (physical(p), the search's own stage planner),
                      (physical(p), data parallelism on every axis) }
                  + { (tensor(p, t), Megatron-LM's stage plan with tensor parallelism on the t axis
                       and data parallelism on the others)  : t | r, t > 1 }

The search's own planner (the exact intra-operator search without a memory limit) picks the
fastest stage plan, so it rarely splits model dims when data parallelism is faster; tensor
parallelism pays where memory binds (it shards weights and, with sequence parallelism, the
activations), which only the pipeline's memory check sees, and a faster plan may hold more memory
than plain data parallelism. The other candidates give that check
the configurations practitioners run inside a node (tensor parallelism 2 or 4 beside data
parallelism 4 or 2 on 8 GPUs, FSDP), each costed by the same chain and evaluator. The 3D search
tries them only at the degrees where the search's own stage plan needs more recompute than the
given one to fit (where memory does not bind there, the time-optimal stage plan is the one to
beat): a pruning rule of the heuristic search, not a proof.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from planner.cluster.mesh import Mesh, MeshAxis
from planner.errors import SettingsError
from planner.search.baselines import data_parallel, megatron

TENSOR_AXIS = "tp"


SEARCH, DATA, TENSOR = "search", "dp", "megatron"


@dataclass(frozen=True, slots=True)
class StageMesh:
    """A stage mesh and its stage plan: ``search`` (the search's own planner), ``dp`` (data
    parallelism on every axis) or ``megatron`` (tensor parallelism on ``tensor_axis``)."""

    mesh: Mesh
    plan: str = SEARCH
    tensor_axis: int | None = None

    def planner(self, default: Callable) -> Callable:
        """The stage planner of this candidate (``default``: the search's own)."""
        if self.plan == SEARCH:
            return default
        if self.plan == DATA:
            return lambda problem: (data_parallel(problem), "HEURISTIC")
        axis = self.tensor_axis
        return lambda problem: (megatron(problem, axis), "HEURISTIC")


def physical_stage_mesh(mesh: Mesh, stages: int) -> Mesh:
    """The mesh less its outer part of ``stages`` devices: whole outer axes, then a divisor of the
    next one (8 stages of node=4,gpu=8: the node axis and 2 of each node's GPUs, stage mesh
    gpu=4); size-1 axes dropped. The pipeline's sends run on the outermost axis's link."""
    sizes, left = list(mesh.shape), stages
    for k, size in enumerate(sizes):
        if left == 1:
            break
        if left % size == 0:
            sizes[k], left = 1, left // size
        elif size % left == 0:
            sizes[k], left = size // left, 1
        else:
            break
    if left != 1:
        raise SettingsError(
            f"--pp: {stages} stages are not an outer part of mesh {mesh.spec} (known: "
            f"{', '.join(map(str, pipeline_degrees(mesh)))})"
        )
    return mesh.sub_mesh(tuple(sizes))


def pipeline_degrees(mesh: Mesh) -> list[int]:
    """Every pipeline degree the mesh holds: whole outer axes times a divisor of the next one."""
    found, outer = {1}, 1
    for size in mesh.shape:
        found |= {outer * d for d in range(1, size + 1) if size % d == 0}
        outer *= size
    return sorted(found)


def tensor_stage_mesh(sub: Mesh, degree: int) -> StageMesh:
    """``sub`` with its innermost axis factored as (r / degree, degree), the second named ``tp``
    (``degree`` = r: the innermost axis itself)."""
    inner = sub.axes[-1]
    if inner.size % degree or degree < 2:
        raise SettingsError(f"--tp: {degree} does not divide stage mesh axis {inner.name}")
    if degree == inner.size:
        return StageMesh(sub, TENSOR, len(sub.axes) - 1)
    name = TENSOR_AXIS if TENSOR_AXIS not in sub.names else f"{inner.name}_tp"
    axes = sub.axes[:-1] + (
        MeshAxis(inner.name, inner.size // degree, inner.bandwidth, inner.latency),
        MeshAxis(name, degree, inner.bandwidth, inner.latency),
    )
    return StageMesh(Mesh(axes), TENSOR, len(axes) - 1)


def candidates(mesh: Mesh, stages: int, tensor: bool = True) -> list[StageMesh]:
    """The physical stage mesh under the search's planner, then (``tensor``) under data
    parallelism and every tensor-parallel factoring of its innermost axis, smallest degree
    first."""
    sub = physical_stage_mesh(mesh, stages)
    found = [StageMesh(sub)]
    if tensor and sub.num_devices > 1:
        found.append(StageMesh(sub, DATA))
        size = sub.axes[-1].size
        found += [tensor_stage_mesh(sub, t) for t in range(2, size + 1) if size % t == 0]
    return found


def stage_mesh(mesh: Mesh, stages: int, spec: str | None = None) -> Mesh:
    """The stage mesh of a plan: the physical one, or the candidate whose spec is ``spec`` (a plan
    file's ``pipeline.stage_mesh``)."""
    for candidate in candidates(mesh, stages, spec is not None):
        if spec is None or candidate.mesh.spec == spec:
            return candidate.mesh
    raise SettingsError(
        f"--plan: field 'pipeline.stage_mesh': {spec!r} is not a stage mesh of {stages} stages on "
        f"{mesh.spec} (known: "
        f"{', '.join(c.mesh.spec for c in candidates(mesh, stages))})"
    )
