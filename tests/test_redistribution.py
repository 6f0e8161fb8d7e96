"""Every single-axis transition, a two-axis case, and the backward transposes, against hand-computed bytes."""

import pytest

from planner.cost import edge_cost, redistribute
from planner.strategy import GRAD_PARTIAL, PARTIAL, REPLICATE

SHAPE = (16, 32)
BYTES = 2
FULL = 16 * 32 * BYTES


def moves(src, dst, mesh=(8,), shape=SHAPE):
    return [(c.kind, c.axis, c.nbytes) for c in redistribute(shape, BYTES, src, dst, mesh, "fwd")]


@pytest.mark.parametrize("src,dst,expected", [
    ((0,), (REPLICATE,), [("all_gather", 0, FULL)]),
    ((PARTIAL,), (REPLICATE,), [("all_reduce", 0, FULL)]),
    ((PARTIAL,), (1,), [("reduce_scatter", 0, FULL)]),
    ((0,), (1,), [("all_to_all", 0, FULL / 8)]),
    ((REPLICATE,), (0,), []),
    ((0,), (0,), []),
    ((REPLICATE,), (REPLICATE,), []),
])
def test_single_axis(src, dst, expected):
    assert moves(src, dst) == expected


def test_two_axes_hand_computed():
    # [S(0), P] -> [R, S(1)] on a 2x4 mesh: reduce-scatter on axis 1 of the local (16/2 x 32) block,
    # then all-gather on axis 0 of the result (16 x 32/4 after gathering).
    got = moves((0, PARTIAL), (REPLICATE, 1), mesh=(2, 4))
    assert got == [("reduce_scatter", 1, FULL / 2), ("all_gather", 0, FULL / 4)]
    # [S(0), S(0)] -> [R, R]: gathers grow the buffer one axis at a time.
    assert moves((0, 0), (REPLICATE, REPLICATE), mesh=(2, 4)) == [("all_gather", 0, FULL / 4), ("all_gather", 1, FULL)]


def _bwd(src, dst, mesh=(8,)):
    rec = edge_cost(SHAPE, BYTES, src, dst, mesh, True)
    return [(c.kind, c.nbytes) for c in rec.comm if c.phase == "bwd"]


def test_backward_transposes():
    # forward all-gather <-> backward reduce-scatter of the gradient
    assert _bwd((0,), (GRAD_PARTIAL,)) == [("reduce_scatter", FULL)]
    # forward slice (Replicate -> Shard) <-> backward all-gather
    assert _bwd((REPLICATE,), (0,)) == [("all_gather", FULL)]
    # forward all-to-all <-> backward all-to-all
    assert _bwd((0,), (1,)) == [("all_to_all", FULL / 8)]
    # forward all-reduce of a Partial <-> nothing in backward
    assert _bwd((PARTIAL,), (REPLICATE,)) == []
    # Megatron f: replicated forward, Partial gradient -> backward all-reduce
    assert _bwd((REPLICATE,), (GRAD_PARTIAL,)) == [("all_reduce", FULL)]


def test_no_gradient_no_backward():
    rec = edge_cost(SHAPE, BYTES, (REPLICATE,), (0,), (8,), False)
    assert rec.comm == ()


def test_shard_replicate_shard_never_beats_all_to_all():
    direct = sum(n for _, _, n in moves((0,), (1,)))
    via_replicate = sum(n for _, _, n in moves((0,), (REPLICATE,)))
    assert direct < via_replicate
