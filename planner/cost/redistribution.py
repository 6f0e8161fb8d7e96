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

import functools
import math
from dataclasses import dataclass, field
from typing import Sequence

from planner.cluster.mesh import Mesh
from planner.cost.collectives import Collective, collective_seconds, hierarchical_steps, scaled
from planner.cost.records import CostRecord
from planner.cost.strategy import (
    PARTIAL,
    REPLICATE,
    Layout,
    forward_layout,
    gradient_layout,
    gradient_target,
    layout_divides,
    shard_factor,
)

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


def redistribution_steps(
    shape: tuple[int, ...], src: Layout, dst: Layout, mesh_shape: tuple[int, ...]
) -> tuple[Step, ...]:
    """The steps from layout ``src`` to ``dst`` of a tensor of ``shape``. A Partial placement in
    ``dst`` stays as it is and must already be Partial in ``src`` (nothing creates a pending sum).
    A slice, reduce-scatter or all-to-all that would cut a dim into more blocks than it has rows
    (a small dim still sharded on an axis about to be gathered) waits until after the all-gathers.
    Several axes on one dim hold blocks major-first (the first axis in mesh order is the major
    block), so a step on an axis whose dim an inner axis also shards gathers the inner axes first
    and slices them back afterwards: a plain all-gather there would not leave each device a
    contiguous block."""
    return _steps(_divisibility(shape, mesh_shape), tuple(src), tuple(dst), tuple(mesh_shape))


def _numel(shape: Sequence[int]) -> float:
    numel = 1.0  # a float product, in dim order: the byte counts every caller derives from it agree
    for dim in shape:
        numel *= dim
    return numel


def _divisibility(shape: Sequence[int], mesh_shape: Sequence[int]) -> tuple[int, ...]:
    """The shape as the steps read it: only divisibility by products of axis sizes matters, which
    the gcd of each dim with the device count keeps (so tensors of many shapes share a cache
    entry)."""
    total = math.prod(mesh_shape)
    return tuple(math.gcd(int(dim), total) for dim in shape)


@functools.lru_cache(maxsize=1 << 18)
def _steps(
    shape: tuple[int, ...], src: Layout, dst: Layout, mesh_shape: tuple[int, ...]
) -> tuple[Step, ...]:
    if any(want == PARTIAL and have != PARTIAL for have, want in zip(src, dst)):
        raise ValueError(f"redistribution: {src} -> {dst} would create a Partial placement")
    plan = _Steps(shape, list(src), tuple(dst), mesh_shape)
    axes = range(len(src))
    for kind, wanted in (
        ("slice", lambda ax: plan.cur[ax] == REPLICATE),
        ("reduce_scatter", lambda ax: plan.cur[ax] == PARTIAL),
        ("all_to_all", lambda ax: plan.cur[ax] >= 0 and plan.cur[ax] != dst[ax]),
    ):
        for ax in axes:
            if dst[ax] >= 0 and wanted(ax):
                plan.move(kind, [ax], _DST)
    pending = [ax for ax in axes if dst[ax] == REPLICATE and plan.cur[ax] == PARTIAL]
    if pending:
        plan.move("all_reduce", pending, REPLICATE, wait=False)
    for ax in axes:
        if dst[ax] == REPLICATE and plan.cur[ax] >= 0:
            plan.move("all_gather", [ax], REPLICATE, wait=False)
    plan.slice_back()
    plan.finish_waiting()
    plan.slice_back()
    if tuple(plan.cur) != tuple(dst):
        raise ValueError(f"redistribution: {src} -> {dst} ended in {tuple(plan.cur)}")
    return tuple(plan.steps)


@dataclass(slots=True)
class _Steps:
    """The layout as it changes (``cur``), the steps so far and the steps waiting for the
    gathers."""

    shape: tuple[int, ...]
    cur: list[int]
    dst: Layout
    mesh_shape: tuple[int, ...]
    steps: list[Step] = field(default_factory=list)
    waiting: list[tuple[str, int]] = field(default_factory=list)

    def _append(self, kind: str, axes: tuple[int, ...], after: list[int]) -> None:
        self.steps.append(Step(kind, axes, tuple(self.cur), tuple(after)))
        self.cur[:] = after

    def regroup(self, kind: str, ax: int, placement: int) -> None:
        """Adding or removing axis ``ax`` on a dim that an inner axis also shards (and keeps
        sharded) moves the inner axis's blocks: gather it first; ``slice_back`` re-slices it."""
        touched = {self.cur[ax]} if kind in ("all_to_all", "all_gather") else set()
        if kind != "all_gather":
            touched.add(self.dst[ax] if placement == _DST else placement)
        for inner in reversed(range(ax + 1, len(self.cur))):
            if self.cur[inner] >= 0 and self.cur[inner] in touched and self.dst[inner] >= 0:
                self._append(
                    "all_gather",
                    (inner,),
                    [REPLICATE if a == inner else p for a, p in enumerate(self.cur)],
                )

    def move(self, kind: str, axes: list[int], placement: int, wait: bool = True) -> None:
        if kind != "all_reduce":
            self.regroup(kind, axes[0], placement)
        after = [
            (self.dst[a] if placement == _DST else placement) if a in axes else p
            for a, p in enumerate(self.cur)
        ]
        if wait and not layout_divides(self.shape, tuple(after), self.mesh_shape):
            self.waiting.append((kind, axes[0]))
            return
        self._append(kind, tuple(axes), after)

    def slice_back(self) -> None:
        """Slice every axis the target shards and the layout replicates (free), outer axes first."""
        for ax in range(len(self.cur)):
            if (
                self.dst[ax] >= 0
                and self.cur[ax] == REPLICATE
                and all(ax != a for _, a in self.waiting)
            ):
                self.move("slice", [ax], _DST)

    def finish_waiting(self) -> None:
        """Run the waiting steps, each as soon as its result is a valid layout. When none is (two
        axes swapping small dims), the first one is split: an all-to-all into an all-gather and a
        slice, a reduce-scatter into an all-reduce and a slice. A slice alone always fits in the
        end: the layout is then the target's but for Replicate axes, and a subset of a valid
        target's blocks divides the dims."""
        while self.waiting:
            for i, (kind, ax) in enumerate(self.waiting):
                after = tuple(self.dst[ax] if a == ax else p for a, p in enumerate(self.cur))
                if layout_divides(self.shape, after, self.mesh_shape):
                    self.waiting.pop(i)
                    self.move(
                        "slice" if self.cur[ax] == REPLICATE else kind, [ax], _DST, wait=False
                    )
                    break
            else:
                split = next(
                    (i for i, (kind, _) in enumerate(self.waiting) if kind != "slice"), None
                )
                if split is None:
                    raise ValueError(
                        f"redistribution: no valid order reaches {self.dst} from {tuple(self.cur)}"
                    )
                kind, ax = self.waiting.pop(split)
                self.move(
                    "all_gather" if kind == "all_to_all" else "all_reduce",
                    [ax],
                    REPLICATE,
                    wait=False,
                )
                self.waiting.insert(split, ("slice", ax))


def redistribute(
    shape: tuple[int, ...],
    elem_bytes: int,
    src: Layout,
    dst: Layout,
    mesh_shape: tuple[int, ...],
    phase: str,
) -> tuple[Collective, ...]:
    """Collectives that turn layout ``src`` into ``dst``. Each is charged on the local buffer it
    starts from, except the all-gather, charged on the gathered buffer it ends with (ring formulas
    in ``planner.cost.collectives``)."""
    numel = _numel(shape)
    return tuple(
        Collective(phase, kind, ax, scaled(numel * elem_bytes / factor, chain))
        for kind, ax, factor, chain in _recipe(
            _divisibility(shape, mesh_shape), tuple(src), tuple(dst), tuple(mesh_shape)
        )
    )


@functools.lru_cache(maxsize=1 << 18)
def _recipe(
    shape: tuple[int, ...], src: Layout, dst: Layout, mesh_shape: tuple[int, ...]
) -> tuple[tuple[str, int, int, tuple[int, ...]], ...]:
    """Per collective of ``redistribute``: kind, axis, the shard factor of the buffer the step is
    charged on, and the ``hierarchical_steps`` chain from that buffer (axes of size 1 dropped)."""
    out = []
    for step in _steps(shape, src, dst, mesh_shape):
        if step.kind == "slice":
            continue
        factor = shard_factor(step.after if step.kind == "all_gather" else step.before, mesh_shape)
        if step.kind == "all_reduce":
            axes = [ax for ax in step.axes if mesh_shape[ax] > 1]
            out.extend(
                (kind, ax, factor, chain)
                for kind, ax, chain in hierarchical_steps(axes, mesh_shape)
            )
        else:
            out.append((step.kind, step.axes[0], factor, ()))
    return tuple(c for c in out if mesh_shape[c[1]] > 1)


def edge_cost(
    shape: tuple[int, ...],
    elem_bytes: int,
    producer_layout: Layout,
    consumer_layout: Layout,
    mesh_shape: tuple[int, ...],
    needs_grad: bool,
) -> CostRecord:
    """Forward redistribution producer -> consumer plus, if needed, its transposed gradient."""
    comm = redistribute(
        shape, elem_bytes, producer_layout, forward_layout(consumer_layout), mesh_shape, "fwd"
    )
    if needs_grad:
        comm += redistribute(
            shape,
            elem_bytes,
            gradient_layout(consumer_layout),
            gradient_target(producer_layout),
            mesh_shape,
            "bwd",
        )
    return CostRecord(comm=comm)


def edge_seconds(
    shape: tuple[int, ...],
    elem_bytes: int,
    producer_layout: Layout,
    consumer_layout: Layout,
    mesh: Mesh,
    needs_grad: bool,
) -> float:
    """``seconds(edge_cost(...))`` without building the records, for the cost tables (one call per
    layout pair of every edge): the same collectives, summed per kind in the order ``breakdown``
    sums them, so the two agree to the last bit (tested)."""
    numel = _numel(shape)
    legs = [(tuple(producer_layout), forward_layout(consumer_layout))]
    if needs_grad:
        legs.append((gradient_layout(consumer_layout), gradient_target(producer_layout)))
    divisibility, by_kind = _divisibility(shape, mesh.shape), {}
    for src, dst in legs:
        for kind, ax, factor, chain in _recipe(divisibility, src, dst, mesh.shape):
            axis = mesh.axes[ax]
            t = collective_seconds(
                kind,
                axis.size,
                axis.bandwidth,
                axis.latency,
                scaled(numel * elem_bytes / factor, chain),
            )
            by_kind[kind] = by_kind.get(kind, 0.0) + t
    return sum(by_kind.values())


def hierarchical_layouts(
    shape: Sequence[int], before: Layout, axes: Sequence[int], mesh_shape: Sequence[int]
) -> list[Layout] | None:
    """The layouts a hierarchical all-reduce over ``axes`` (outer first, sizes > 1) passes through,
    one axis changed per step (``hierarchical_steps``): reduce-scatters on the inner axes over the
    largest local dim that divides, the all-reduce on the outer axis, all-gathers back. None: no dim
    divides."""
    inner = math.prod(mesh_shape[ax] for ax in axes[1:])
    local = [
        n // math.prod(mesh_shape[ax] for ax, p in enumerate(before) if p == d)
        for d, n in enumerate(shape)
    ]
    dims = [d for d in range(len(shape)) if local[d] % inner == 0]
    if not dims:
        return None
    dim, current, out = max(dims, key=lambda d: (local[d], -d)), list(before), []
    for kind, ax, _ in hierarchical_steps(axes, mesh_shape):
        current[ax] = dim if kind == "reduce_scatter" else REPLICATE
        out.append(tuple(current))
    return out
