"""The whole-cluster configuration of a 3D plan as one value (torchtitan's ``ParallelDims``,
Megatron-LM's parallel arguments): each parallel dimension a named field, derived once, where the
plan is built, and read from there by the report, the JSON, the launch exporters and the
experiments (none of them re-derives degrees from the operators' strategies).

    stage mesh axes a_1 .. a_n, each of size |a_k| on the link of physical level level(a_k)
    role(a_k) = tensor  if a linear of the layers splits a non-batch dim on a_k
                data    if every linear of the layers splits the batch on a_k
                none    otherwise (a_k splits no linear: replicated, or only other operators)
    tensor_parallel_degree = prod |a_k| over tensor axes
    data_parallel_degree   = prod |a_k| over the other axes    (a replicated axis holds copies)
    world = pipeline_degree x data_parallel_degree x tensor_parallel_degree
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from planner.pipeline.schedule import PipelinePlan, parse_schedule

TENSOR, DATA, NONE = "tensor", "data", "none"
ROLES = (TENSOR, DATA, NONE)


@dataclass(frozen=True, slots=True)
class LayoutAxis:
    """One axis of the stage mesh: its size, the physical level whose link it runs on (``tp``
    factored from a node's GPUs runs on ``gpu``) and its role for the layers' linears."""

    name: str
    size: int
    level: str
    role: str


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """A 3D plan's configuration: pipeline degree, cuts, schedule and virtual stages, the stage
    mesh's axes, the data-, tensor-, context- and expert-parallel degrees, micro-batches (size
    per data-parallel replica, count), ZeRO stage, sequence parallelism and recompute."""

    pipeline_degree: int
    cuts: tuple[int, ...]
    schedule: str
    virtual_stages: int
    stage_mesh: str
    mesh_axes: tuple[LayoutAxis, ...]
    data_parallel_degree: int
    tensor_parallel_degree: int
    # the micro-batch each data-parallel replica runs (None: the data axes do not divide it)
    micro_batch_per_replica: int | None
    num_microbatches: int
    zero: int | str
    sequence_parallel: bool
    recompute: str
    context_parallel_degree: int = 1  # context parallelism is not modelled yet: always 1
    expert_parallel_degree: int = 1  # expert parallelism is not modelled yet: always 1

    @property
    def world(self) -> int:
        """Devices in use: pipeline x data x tensor (x context x expert) degrees."""
        return (
            self.pipeline_degree
            * self.data_parallel_degree
            * self.tensor_parallel_degree
            * self.context_parallel_degree
            * self.expert_parallel_degree
        )

    @property
    def tensor_axes(self) -> tuple[LayoutAxis, ...]:
        return tuple(a for a in self.mesh_axes if a.role == TENSOR)

    def to_dict(self) -> dict:
        """The JSON form (``planner-3d`` files' ``layout``)."""
        return {
            "pipeline_degree": self.pipeline_degree,
            "data_parallel_degree": self.data_parallel_degree,
            "tensor_parallel_degree": self.tensor_parallel_degree,
            "context_parallel_degree": self.context_parallel_degree,
            "expert_parallel_degree": self.expert_parallel_degree,
            "cuts": list(self.cuts),
            "schedule": self.schedule,
            "virtual_stages": self.virtual_stages,
            "stage_mesh": self.stage_mesh,
            "mesh_axes": [
                {"name": a.name, "size": a.size, "level": a.level, "role": a.role}
                for a in self.mesh_axes
            ],
            "micro_batch_per_replica": self.micro_batch_per_replica,
            "num_microbatches": self.num_microbatches,
            "zero": self.zero,
            "sequence_parallel": self.sequence_parallel,
            "recompute": self.recompute,
        }


def axis_roles(axes: Iterable[str], linear_dims: Iterable[tuple[str | None, ...]]) -> list[str]:
    """Each stage-mesh axis's role (see the module docstring) from the dims the layers' linears
    split on it, one tuple per linear in axis order."""
    names, rows = list(axes), list(linear_dims)
    roles = []
    for k in range(len(names)):
        dims = [row[k] for row in rows]
        if any(d not in (None, "b") for d in dims):
            roles.append(TENSOR)
        elif dims and all(d == "b" for d in dims):
            roles.append(DATA)
        else:
            roles.append(NONE)
    return roles


def axis_levels(stage_axes: Iterable[str], physical: Iterable[str]) -> list[str]:
    """The physical level of each stage-mesh axis: itself where the mesh has it, else (a logical
    axis factored from the innermost level before it) that level."""
    known, levels, last = set(physical), [], None
    for name in stage_axes:
        last = name if name in known else (last or name)
        levels.append(name if name in known else last)
    return levels


def make_layout(
    pipe: PipelinePlan,
    axes: tuple[tuple[str, int], ...],
    physical: Iterable[str],
    linear_dims: Iterable[tuple[str | None, ...]],
    settings,
) -> ParallelLayout:
    """The layout of a costed pipeline on a stage mesh of ``axes`` ((name, size) outermost first)
    whose layers' linears split ``linear_dims`` (one tuple per linear, in axis order)."""
    names = [name for name, _ in axes]
    roles = axis_roles(names, linear_dims)
    levels = axis_levels(names, physical)
    mesh_axes = tuple(
        LayoutAxis(name, size, level, role)
        for (name, size), level, role in zip(axes, levels, roles)
    )
    tp = math.prod(a.size for a in mesh_axes if a.role == TENSOR)
    dp = math.prod(a.size for a in mesh_axes) // tp
    _, virtual = parse_schedule(pipe.schedule)
    split = math.prod(a.size for a in mesh_axes if a.role == DATA)
    per_replica = pipe.micro_batch // split if pipe.micro_batch % split == 0 else None
    return ParallelLayout(
        pipeline_degree=pipe.stages,
        cuts=tuple(pipe.cuts),
        schedule=pipe.schedule,
        virtual_stages=virtual,
        stage_mesh=",".join(f"{name}={size}" for name, size in axes),
        mesh_axes=mesh_axes,
        data_parallel_degree=dp,
        tensor_parallel_degree=tp,
        micro_batch_per_replica=per_replica,
        num_microbatches=pipe.num_microbatches,
        zero=settings.zero,
        sequence_parallel=settings.sequence_parallel,
        recompute=settings.recompute,
    )
