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


# the words of a flat plan (planner.search: exact, heuristic, evaluate); a 3D plan uses the same
STATUS_WORDS = {"OPTIMAL", "FEASIBLE", "HEURISTIC", "GIVEN", "INFEASIBLE", "UNKNOWN"}


def test_flat_and_3d_plans_use_the_same_status_words(plans):
    """A searched 3D plan is HEURISTIC (its parts may be exact, their composition is not proven);
    a configuration costed as given (``evaluate_3d``, a plan file read back) is GIVEN, as a flat
    ``evaluate`` is; the cut search's own status is on the pipeline: OPTIMAL for the exact DP."""
    flat, piped = plans
    assert flat.status == "OPTIMAL" and piped.status == "HEURISTIC"
    given = planner.evaluate_3d("gpt3-1.3b", tp=2, pp=2, dp=2, batch=32)
    assert given.status == given.pipeline.status == "GIVEN" and given.found
    exact_cuts = planner.plan_pipeline(
        "gpt3-1.3b", "node=4,gpu=2", batch=32, method="exact", degrees=[2]
    )
    assert exact_cuts.pipeline.status == "OPTIMAL" and exact_cuts.status == "HEURISTIC"
    assert piped.pipeline.status == "HEURISTIC"  # csimd, the default cut search
    from planner.api3d import evaluate_3d_file  # what `planner evaluate --plan` runs on 3D JSON

    loaded = evaluate_3d_file(piped.to_dict(), "gpt3-1.3b", batch=32, settings=piped.settings)
    assert loaded.status == "GIVEN"
    assert loaded.pipeline.iteration_time_s == pytest.approx(piped.pipeline.iteration_time_s)
    flat_given = planner.evaluate("gpt2-small", tp=2, dp=4)
    assert flat_given.status == "GIVEN"
    for result in (flat, piped, given, exact_cuts, loaded, flat_given):
        assert result.status in STATUS_WORDS and result.summary_row()["status"] == result.status


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
