"""Redistribution: the steps that turn one layout of a tensor into another, and what they cost.

``redistribution_steps`` is the one definition of how a layout changes, axis by axis. The cost
model charges its collectives (``redistribute``, ``edge_cost``); the numpy executor
(``planner.engines.executor``) performs the same steps on local shards. Order: local slices,
then reduce-scatters (both shrink data), all-to-alls, one (hierarchical) all-reduce of every
Partial axis that becomes Replicate, and all-gathers last, so every collective moves the smallest
buffer it can.

Per edge of the graph: the forward redistribution producer -> consumer and, when the tensor
carries a gradient, the transposed redistribution of the gradient (consumer -> producer).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.collectives import Collective, hierarchical_all_reduce
from planner.cost.records import CostRecord
from planner.cost.strategy import (PARTIAL, REPLICATE, Layout, forward_layout, gradient_layout, gradient_target,
                                   layout_divides, shard_factor)

STEP_KINDS = ("slice", "reduce_scatter", "all_to_all", "all_reduce", "all_gather")
_DST = -100  # move(): take the placement from the target layout


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a layout change: ``kind`` on ``axes`` (several only for the all-reduce, which
    reduces every Partial axis together), from layout ``before`` to layout ``after``."""

    kind: str
    axes: tuple[int, ...]
    before: Layout
    after: Layout

    def __post_init__(self) -> None:
        if self.kind not in STEP_KINDS:
            raise ValueError(f"redistribution step: unknown kind {self.kind!r}")


def redistribution_steps(shape: tuple[int, ...], src: Layout, dst: Layout,
                         mesh_shape: tuple[int, ...]) -> tuple[Step, ...]:
    """The steps from layout ``src`` to ``dst`` of a tensor of ``shape``. A Partial placement in
    ``dst`` stays as it is and must already be Partial in ``src`` (nothing creates a pending sum).
    A slice, reduce-scatter or all-to-all that would cut a dim into more blocks than it has rows
    (a small dim still sharded on an axis about to be gathered) waits until after the all-gathers."""
    if any(want == PARTIAL and have != PARTIAL for have, want in zip(src, dst)):
        raise ValueError(f"redistribution: {src} -> {dst} would create a Partial placement")
    cur = list(src)
    steps: list[Step] = []
    waiting: list[tuple[str, int]] = []

    def move(kind: str, axes: list[int], placement: int, wait: bool = True) -> None:
        after = list(cur)
        for ax in axes:
            after[ax] = placement if placement != _DST else dst[ax]
        if wait and not layout_divides(shape, tuple(after), mesh_shape):
            waiting.append((kind, axes[0]))
            return
        steps.append(Step(kind, tuple(axes), tuple(cur), tuple(after)))
        cur[:] = after

    axes = range(len(cur))
    for ax in axes:
        if dst[ax] >= 0 and cur[ax] == REPLICATE:
            move("slice", [ax], _DST)
    for ax in axes:
        if dst[ax] >= 0 and cur[ax] == PARTIAL:
            move("reduce_scatter", [ax], _DST)
    for ax in axes:
        if dst[ax] >= 0 and cur[ax] >= 0 and cur[ax] != dst[ax]:
            move("all_to_all", [ax], _DST)
    pending = [ax for ax in axes if dst[ax] == REPLICATE and cur[ax] == PARTIAL]
    if pending:
        move("all_reduce", pending, REPLICATE, wait=False)
    for ax in axes:
        if dst[ax] == REPLICATE and cur[ax] >= 0:
            move("all_gather", [ax], REPLICATE, wait=False)
    _finish_waiting(waiting, cur, dst, move, shape, mesh_shape)
    if tuple(cur) != tuple(dst):
        raise ValueError(f"redistribution: {src} -> {dst} ended in {tuple(cur)}")
    return tuple(steps)


def _finish_waiting(waiting: list[tuple[str, int]], cur: list[int], dst: Layout, move, shape, mesh_shape) -> None:
    """Run the waiting steps, each as soon as its result is a valid layout. When none is (two axes
    swapping small dims), the first one is split: an all-to-all into an all-gather and a slice, a
    reduce-scatter into an all-reduce and a slice. A slice alone always fits in the end: once the
    others are done, the layout is the target's but for Replicate axes, and a subset of a valid
    target's blocks divides the dims."""
    while waiting:
        for i, (kind, ax) in enumerate(waiting):
            after = tuple(dst[ax] if a == ax else p for a, p in enumerate(cur))
            if layout_divides(shape, after, mesh_shape):
                waiting.pop(i)
                move(kind, [ax], _DST, wait=False)
                break
        else:
            split = next((i for i, (kind, _) in enumerate(waiting) if kind != "slice"), None)
            if split is None:
                raise ValueError(f"redistribution: no valid order reaches {tuple(dst)} from {tuple(cur)}")
            kind, ax = waiting.pop(split)
            move("all_gather" if kind == "all_to_all" else "all_reduce", [ax], REPLICATE, wait=False)
            waiting.insert(split, ("slice", ax))


def redistribute(shape: tuple[int, ...], elem_bytes: int, src: Layout, dst: Layout,
                 mesh_shape: tuple[int, ...], phase: str) -> tuple[Collective, ...]:
    """Collectives that turn layout ``src`` into ``dst``. Each is charged on the local buffer it
    starts from, except the all-gather, charged on the gathered buffer it ends with (ring formulas
    in ``planner.cost.collectives``)."""
    numel = 1.0
    for s in shape:
        numel *= s
    out: list[Collective] = []
    for step in redistribution_steps(shape, src, dst, mesh_shape):
        layout = step.after if step.kind == "all_gather" else step.before
        local = numel * elem_bytes / shard_factor(layout, mesh_shape)
        if step.kind == "all_reduce":
            out.extend(hierarchical_all_reduce(phase, [ax for ax in step.axes if mesh_shape[ax] > 1], local, mesh_shape))
        elif step.kind != "slice":
            out.append(Collective(phase, step.kind, step.axes[0], local))
    return tuple(c for c in out if mesh_shape[c.axis] > 1)


def edge_cost(shape: tuple[int, ...], elem_bytes: int, producer_layout: Layout, consumer_layout: Layout,
              mesh_shape: tuple[int, ...], needs_grad: bool) -> CostRecord:
    """Forward redistribution producer -> consumer plus, if needed, its transposed gradient."""
    comm = redistribute(shape, elem_bytes, producer_layout, forward_layout(consumer_layout), mesh_shape, "fwd")
    if needs_grad:
        comm += redistribute(shape, elem_bytes, gradient_layout(consumer_layout), gradient_target(producer_layout),
                             mesh_shape, "bwd")
    return CostRecord(comm=comm)
