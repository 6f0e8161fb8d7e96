"""One edge of a plan on PyTorch: the producer's block moved to the consumer's layout by the cost
model's own redistribution steps, each a DTensor ``redistribute`` on one mesh axis.

``planner.cost.redistribution.redistribution_steps`` is the one definition of how a layout changes
(local slices, reduce-scatters, all-to-alls, one all-reduce of every Partial axis, all-gathers).
DTensor's ``redistribute`` from one layout straight to another would pick its own order (it
reduces a Partial over two axes with two all-reduces of the whole buffer, and gathers a dim split
over two axes inner axis first), so the edge walks the steps: every step changes one axis and
DTensor runs its one collective. An all-reduce over several axes runs as the cost model prices it
(``hierarchical_steps``): reduce-scatters on the inner axes over the tensor's largest dim that
divides, the all-reduce on the outer axis, all-gathers back. The gradient runs the transposed edge
the same way (consumer's gradient layout -> the producer's gradient target), in an
``autograd.Function``, so every collective of the step, forward and backward, is DTensor's and
follows the plan.

A parameter's gradient is reduced where it is read, as the cost model charges it (the reader's
gradient all-reduce over the axes it is Partial on), before a tied read's gradient moves to the
owner's layout; in a 3D run it may stay Partial over the micro-batches and be reduced once per step
(``defer``, ``reduce_deferred``), as the 3D model syncs gradients once.

DTensor on CPU has no all-to-all (gloo): ``Shard(i) -> Shard(j)`` falls back to an all-gather and a
local chunk (torch/distributed/tensor/_collective_utils.py, ``shard_dim_alltoall``). The counting
mode is told, and records that step as the all-to-all DTensor issues on GPUs (the bytes of the local
buffer, as the cost model counts it), keeping gloo's all-gather bytes in ``fallback``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from planner.cost.redistribution import hierarchical_layouts, redistribution_steps
from planner.cost.strategy import (
    GRAD_PARTIAL,
    PARTIAL,
    REPLICATE,
    forward_layout,
    gradient_layout,
    gradient_target,
)


def placements(layout):
    """DTensor placements of a layout (GRAD_PARTIAL and PARTIAL are Partial)."""
    return tuple(
        Partial() if p in (PARTIAL, GRAD_PARTIAL) else Replicate() if p == REPLICATE else Shard(p)
        for p in layout
    )


@dataclass(frozen=True)
class PlannedEdge:
    """A tensor of ``shape`` produced in ``src`` and read by a consumer in ``layout`` (input layout,
    GRAD_PARTIAL kept) on ``mesh`` (a DeviceMesh of ``mesh_shape``)."""

    mesh: object
    shape: tuple[int, ...]
    mesh_shape: tuple[int, ...]
    src: tuple
    layout: tuple
    counter: object = None
    # a parameter: its gradient is first reduced where it is read (see backward)
    param: bool = False
    # a parameter whose reduction waits for the step's last micro-batch (3D plans)
    defer: bool = False

    def apply(self, local):
        """The consumer's block; its gradient comes back to the producer by the transposed steps."""
        return _EdgeFunction.apply(local, self)

    def move(self, local, src, dst):
        """``local`` (a block in ``src``) moved to ``dst`` step by step."""
        strides = tuple(int(math.prod(self.shape[k + 1 :])) for k in range(len(self.shape)))
        value = DTensor.from_local(
            local, self.mesh, placements(src), run_check=False, shape=self.shape, stride=strides
        )
        steps = redistribution_steps(self.shape, tuple(src), tuple(dst), self.mesh_shape)
        i = 0
        while i < len(steps):
            step, group = steps[i], self._outer_gathers(steps, i)
            if group:
                value = self._gather_major_first(value, steps[i : i + group])
                i += group
                continue
            if (
                step.kind == "all_reduce"
                and len([a for a in step.axes if self.mesh_shape[a] > 1]) > 1
            ):
                value = self._hierarchical(value, step)
            elif step.kind == "all_to_all":
                value = self._all_to_all(value, step)
            else:
                value = value.redistribute(self.mesh, placements(step.after))
            i += 1
        return value.to_local()

    def _outer_gathers(self, steps, i: int) -> int:
        """How many steps from ``i`` gather every axis of one dim outer axis first (0: not such a
        run). DTensor cannot gather an outer axis while an inner one still splits the dim (its
        blocks would not be contiguous), so such a run goes through ``_gather_major_first``."""
        step = steps[i]
        if step.kind != "all_gather":
            return 0
        dim = step.before[step.axes[0]]
        axes = [a for a, p in enumerate(step.before) if p == dim]
        if (
            len(axes) < 2
            or axes[0] != step.axes[0]
            or self.shape[dim] % math.prod(self.mesh_shape[a] for a in axes)
        ):
            return 0
        run = steps[i : i + len(axes)]
        if [(s.kind, s.axes) for s in run] != [("all_gather", (a,)) for a in axes]:
            return 0
        return len(axes)

    def _gather_major_first(self, value, run):
        """All-gathers of every axis of dim d, outer first, as the cost model orders them: on a view
        of the tensor where d is split into one dim per axis (mesh order) and the rest, each axis
        shards its own dim, so each gather is a plain one; the view is folded back at the end."""
        dim = run[0].before[run[0].axes[0]]
        axes = [a for a, p in enumerate(run[0].before) if p == dim]
        sizes, k = tuple(self.mesh_shape[a] for a in axes), len(axes)
        rest = self.shape[dim] // math.prod(sizes)
        view_shape = self.shape[:dim] + sizes + (rest,) + self.shape[dim + 1 :]
        local = value.to_local()
        view_local = local.reshape(local.shape[:dim] + (1,) * k + (rest,) + local.shape[dim + 1 :])
        layout = [
            dim + axes.index(a) if a in axes else (p + k if p > dim else p)
            for a, p in enumerate(run[0].before)
        ]
        strides = tuple(int(math.prod(view_shape[j + 1 :])) for j in range(len(view_shape)))
        view = DTensor.from_local(
            view_local.contiguous(),
            self.mesh,
            placements(layout),
            run_check=False,
            shape=view_shape,
            stride=strides,
        )
        for step in run:
            layout[step.axes[0]] = REPLICATE
            view = view.redistribute(self.mesh, placements(tuple(layout)))
        folded = view.to_local().reshape(
            local.shape[:dim] + (self.shape[dim],) + local.shape[dim + 1 :]
        )
        strides = tuple(int(math.prod(self.shape[j + 1 :])) for j in range(len(self.shape)))
        return DTensor.from_local(
            folded.contiguous(),
            self.mesh,
            placements(run[-1].after),
            run_check=False,
            shape=self.shape,
            stride=strides,
        )

    def _hierarchical(self, value, step):
        axes = [a for a in step.axes if self.mesh_shape[a] > 1]
        walk = hierarchical_layouts(self.shape, step.before, axes, self.mesh_shape)
        # nothing divides: DTensor's own order (bytes then differ from the model's)
        if walk is None:
            return value.redistribute(self.mesh, placements(step.after))
        for layout in walk:
            value = value.redistribute(self.mesh, placements(layout))
        return value

    def _all_to_all(self, value, step):
        count_from = len(self.counter.transfers) if self.counter is not None else 0
        nbytes = value.to_local().numel() * value.to_local().element_size()
        value = value.redistribute(self.mesh, placements(step.after))
        if self.counter is not None and value.device_mesh.device_type == "cpu":
            self.counter.as_all_to_all(count_from, float(nbytes))
        return value


def reduce_deferred(edge: PlannedEdge, grad):
    """The gradient a deferred parameter edge left Partial, reduced as the cost model's one
    gradient all-reduce per step (the reader's layout is the stored one: nothing else moves)."""
    return edge.move(grad.contiguous(), gradient_layout(edge.layout), forward_layout(edge.layout))


class _EdgeFunction(torch.autograd.Function):
    """Forward: the edge's steps; backward: the transposed edge's steps on the gradient."""

    @staticmethod
    def forward(ctx, local, edge):
        ctx.edge = edge
        return edge.move(local.detach(), edge.src, forward_layout(edge.layout))

    @staticmethod
    def backward(ctx, grad):
        edge = ctx.edge
        # still Partial: summed over micro-batches, reduced once (reduce_deferred)
        if edge.param and edge.defer:
            return grad.contiguous(), None
        if edge.param:
            # The cost model reduces a parameter's gradient where it is read (the reader's gradient
            # all-reduce over the axes it is Partial on), then a tied read's gradient goes to the
            # owner's layout from the reader's (its tie edge); from Partial straight to the owner's
            # layout would reduce-scatter instead, in another order of steps.
            grad = edge.move(
                grad.contiguous(), gradient_layout(edge.layout), forward_layout(edge.layout)
            )
            return edge.move(
                grad.contiguous(), forward_layout(edge.layout), gradient_target(edge.src)
            ), None
        return edge.move(
            grad.contiguous(), gradient_layout(edge.layout), gradient_target(edge.src)
        ), None
