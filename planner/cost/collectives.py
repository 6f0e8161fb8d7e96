"""Collectives: the bytes a device sends and the ring alpha-beta time of each collective kind.

Collective times on one axis of size p, bandwidth B, latency a, for n bytes (ring algorithms):

    all_gather, reduce_scatter, all_to_all:  (p-1)*a + (p-1)/p * n/B
    all_reduce:                           2*(p-1)*a + 2*(p-1)/p * n/B

A reduction over several axes is hierarchical (``hierarchical_all_reduce``): it moves the bytes of
one flat ring all-reduce over all those devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
# The phases a micro-batch repeats: its passes and, under ZeRO-2/3, the reduce-scatter of its
# gradients (``reduce``); ``grad`` and ``opt`` run once a step.
PER_MICROBATCH = ("fwd", "bwd", "reduce")


@dataclass(frozen=True, slots=True)
class Collective:
    """Bytes moved by ``count`` collectives of one kind on one mesh axis in one phase."""

    phase: str  # fwd | bwd | reduce (per micro-batch) | grad (gradient sync) | opt (after the step)
    kind: str
    axis: int
    nbytes: float
    count: float = 1.0  # collectives issued (fractional: a tensor's share of a gradient bucket)


def bytes_sent(kind: str, size: int, nbytes: float) -> float:
    """Bytes one device sends in a ring collective of ``nbytes`` over ``size`` devices."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r} (known: {', '.join(KINDS)})")
    if size <= 1:
        return 0.0
    return (2.0 if kind == "all_reduce" else 1.0) * (size - 1) / size * nbytes


def collective_seconds(
    kind: str, size: int, bandwidth: float, latency: float, nbytes: float, count: float = 1.0
) -> float:
    """Ring alpha-beta time of ``count`` collectives moving ``nbytes`` in total on one axis."""
    if size <= 1:
        return 0.0
    steps = (2 if kind == "all_reduce" else 1) * (size - 1)
    return steps * latency * count + bytes_sent(kind, size, nbytes) / bandwidth


def hierarchical_all_reduce(
    phase: str, axes: list[int], nbytes: float, mesh_shape: tuple[int, ...]
) -> list[Collective]:
    """All-reduce of ``nbytes`` over several mesh axes (outermost first): reduce-scatter on the
    inner axes (innermost first), all-reduce of the scattered buffer on the outermost axis,
    all-gather back. It moves the bytes of one flat ring all-reduce over all those devices."""
    return [
        Collective(phase, kind, ax, scaled(nbytes, chain))
        for kind, ax, chain in hierarchical_steps(axes, mesh_shape)
    ]


def hierarchical_steps(
    axes: Sequence[int], mesh_shape: Sequence[int]
) -> list[tuple[str, int, tuple[int, ...]]]:
    """The (kind, axis, buffer chain) of ``hierarchical_all_reduce``: a chain of sizes, negative to
    divide and positive to multiply, turns the reduced buffer into the one each step moves."""
    if not axes:
        return []
    out, chain = [], ()
    for ax in reversed(axes[1:]):
        out.append(("reduce_scatter", ax, chain))
        chain += (-mesh_shape[ax],)
    out.append(("all_reduce", axes[0], chain))
    for ax in axes[1:]:
        chain += (mesh_shape[ax],)
        out.append(("all_gather", ax, chain))
    return out


def scaled(nbytes: float, chain: Sequence[int]) -> float:
    """``nbytes`` through a chain of ``hierarchical_steps`` (in order, so the float result is the
    same)."""
    for size in chain:
        nbytes = nbytes / -size if size < 0 else nbytes * size
    return nbytes
