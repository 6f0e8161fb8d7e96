"""Flat and 3D plans answer the same names (``planner.plans.PlanResult``): a script that compares
them reads status, found, step time, memory and one flat CSV row the same way."""

import pytest

import planner
from planner.plans import PlanResult


@pytest.fixture(scope="module")
def plans():
    flat = planner.plan("gpt2-small", mesh="2x4")
    piped = planner.plan_pipeline("gpt3-1.3b", "node=4,gpu=2", batch=32)
    return flat, piped


def test_flat_and_3d_plans_share_the_protocol(plans):
    flat, piped = plans
    for result in plans:
        assert isinstance(result, PlanResult) and result.found and result.fits_memory
        row = result.summary_row()
        assert row["status"] == result.status and row["model"] == result.model
        assert all(not isinstance(value, (dict, list, tuple)) for value in row.values())
        assert "search_time_s" in row and "search_time_s" not in result.summary_row(timings=False)
    assert flat.step_time_s == flat.estimated_step_time_s > 0
    assert piped.step_time_s == piped.pipeline.iteration_time_s > 0
    assert (
        piped.memory_per_device_bytes
        == max(piped.stage_memory_bytes)
        == piped.pipeline.max_memory_bytes
    )


def test_a_flat_plan_that_fits_nowhere_is_not_found():
    """1 GB per device holds no sharding of a 1.3B-parameter model with Adam on 8 devices: the
    failed plan carries its status and reason, no step time and no memory."""
    flat = planner.plan("gpt3-1.3b", mesh="8", memory=1e9)
    assert isinstance(flat, PlanResult) and flat.status == "INFEASIBLE" and not flat.found
    assert flat.step_time_s is None and flat.memory_per_device_bytes is None and flat.explanation
    assert flat.summary_row()["status"] == "INFEASIBLE"


def test_a_3d_plan_that_fits_nowhere_is_refused():
    """The 3D search raises instead (it names the least memory any candidate needs)."""
    from planner.errors import InfeasibleError

    with pytest.raises(InfeasibleError, match="GiB per device"):
        planner.plan_pipeline("gpt3-1.3b", "node=4,gpu=2", batch=32, memory=1e9)
