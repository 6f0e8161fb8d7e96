"""The practitioner's 3D grid (planner/grid3d.py) and the 3D search against it: every grid point is
in the search's space, so no point that fits may be faster than `plan --pipeline auto`."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from planner.api3d import plan_pipeline
from planner.errors import InfeasibleError
from planner.grid3d import GridPoint, grid_best, grid_points


def test_the_grid_holds_what_people_write():
    points = grid_points(world=16, gpus_per_node=8, layers=4, batch=32)
    assert len(set(points)) == len(points)
    degrees = {(p.tp, p.pp, p.dp) for p in points}
    # tensor parallel inside a node only, pipelines of at most the layers, dp the rest
    assert degrees == {
        (t, p, 16 // (t * p)) for t in (1, 2, 4, 8) for p in (1, 2, 4) if 16 % (t * p) == 0
    }
    assert GridPoint(2, 2, 4, 2, "selective", 1) in points
    assert all(32 % (p.dp * p.micro_batch) == 0 for p in points)
    assert GridPoint(2, 1, 8, 1, "full", 3).flags == (
        "--tp 2 --pp 1 --dp 8 --micro-batch 1 --recompute full --zero 3 --sequence-parallel"
    )


def test_the_grid_keeps_the_fastest_point_that_fits():
    model = "gpt:layers=2,hidden=128,heads=4,seq=64,vocab=256"
    points = grid_points(world=4, gpus_per_node=2, layers=2, batch=8, zeros=(3,))
    best, point, fitting = grid_best(model, "a100-80g", points, 8, memory=3e6)
    assert 0 < fitting < len(points)  # the limit binds: some points do not fit
    assert point in points and best.pipeline.fits_memory
    for other in points:
        try:
            again, _, _ = grid_best(model, "a100-80g", [other], 8, memory=3e6)
        except InfeasibleError:
            continue
        if again is not None:
            assert again.pipeline.iteration_time_s >= best.pipeline.iteration_time_s


MODELS = st.sampled_from(
    [
        "gpt:layers=4,hidden=512,heads=8,seq=1024,vocab=1024",
        "llama:layers=4,hidden=512,heads=8,kv_heads=2,ffn=1536,seq=1024,vocab=1024",
        "gpt:layers=6,hidden=256,heads=4,seq=512,vocab=512",
        "gpt:layers=8,hidden=512,heads=8,seq=512,vocab=2048",
    ]
)
MESHES = st.sampled_from(["gpu=4", "node=2,gpu=2", "node=2,gpu=4", "node=4,gpu=2"])


@pytest.mark.slow
@pytest.mark.heavy
@settings(
    max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(MODELS, MESHES, st.sampled_from([8, 16]), st.sampled_from([math.inf, 200e6, 120e6, 80e6]))
def test_no_grid_point_that_fits_beats_the_3d_search(model, mesh, batch, memory):
    layers = int(model.split("layers=")[1].split(",")[0])
    sizes = [int(part.split("=")[1]) for part in mesh.split(",")]
    points = grid_points(math.prod(sizes), sizes[-1], layers, batch)
    best, point, _ = grid_best(model, "a100-80g", points, batch, memory=memory)
    try:
        auto = plan_pipeline(model, mesh, "a100-80g", batch=batch, memory=memory)
    except InfeasibleError:
        assert best is None, f"the grid fits ({point.flags}) where the search finds nothing"
        return
    if best is not None:
        assert auto.pipeline.iteration_time_s <= best.pipeline.iteration_time_s * (1 + 1e-9), (
            point.flags
        )
