"""The Megatron grid (``--method megatron-grid``): the best grid point under the memory limit,
never better than an OPTIMAL exact plan on the same problem (a property over generated cases)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from planner import api
from planner.cost.settings import TrainingSettings
from planner.grid import megatron_grid
from planner.search.baselines import data_parallel, megatron
from planner.plans import make_plan

GPT = "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=1024"


def _problem(mesh: str, settings: TrainingSettings, batch: int = 8, device: str = "a100-80g"):
    cluster = api.make_cluster(mesh, device)
    return api.make_problem(GPT, cluster, settings, batch)


def _every_point(problem) -> list:
    """The grid's points costed one by one, as a test of the grid's choice."""
    from planner.search.layer_modes import layer_options

    options = layer_options(problem, ())
    plans = []
    for variant in (problem, *options.variants):
        plans.append(make_plan(variant, data_parallel(variant), method="m", status="HEURISTIC"))
        for axis, mesh_axis in enumerate(problem.mesh.axes):
            if mesh_axis.size > 1:
                strategies = megatron(variant, axis)
                plans.append(make_plan(variant, strategies, method="m", status="HEURISTIC"))
    return plans


def test_the_grid_takes_the_best_point_that_fits():
    problem = _problem("2x4", TrainingSettings(recompute="auto", zero="auto"))
    points = _every_point(problem)
    assert len(points) == 12 * 3  # 12 uniform modes x (data parallel, tp on node, tp on gpu)
    free = megatron_grid(problem, math.inf)
    assert free.objective == min(p.objective for p in points)
    # a limit under the fastest point's memory: the grid moves to the best point that fits
    fastest = min(points, key=lambda p: p.objective)
    limit = fastest.memory_per_device_bytes - 1
    bound = megatron_grid(problem, limit)
    fitting = [p for p in points if p.memory_per_device_bytes <= limit]
    assert fitting and bound.fits_memory
    assert bound.objective == min(p.objective for p in fitting) > free.objective
    assert "Megatron grid: 36 configurations tried" in bound.notes[0]


def test_with_fixed_settings_the_grid_is_over_the_tensor_axis_only():
    problem = _problem("2x4", TrainingSettings())
    found = api.plan_problem(problem, math.inf, "megatron-grid")
    assert found.status == "HEURISTIC" and "3 configurations tried" in found.notes[0]
    single = api.plan_problem(problem, math.inf, "megatron")
    assert found.objective <= single.objective
    assert found.settings == single.settings


@hsettings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    mesh=st.sampled_from(["4", "2x2", "2x4"]),
    recompute=st.sampled_from(["none", "auto"]),
    zero=st.sampled_from([0, "auto"]),
    squeeze=st.sampled_from([None, 0.7, 0.5]),
)
def test_the_grid_is_never_better_than_exact(mesh, recompute, zero, squeeze):
    problem = _problem(mesh, TrainingSettings(recompute=recompute, zero=zero))
    limit = math.inf
    if squeeze is not None:  # a limit that binds: a share of data parallelism's memory
        dp = make_plan(problem, data_parallel(problem), method="dp", status="HEURISTIC")
        limit = squeeze * dp.memory_per_device_bytes
    exact = api.plan_problem(problem, limit, "exact", time_limit_s=60)
    grid = api.plan_problem(problem, limit, "megatron-grid")
    if exact.status == "OPTIMAL" and grid.fits_memory:
        assert exact.objective <= grid.objective, (exact.objective, grid.objective)
    if grid.fits_memory:
        assert exact.status == "OPTIMAL"  # the grid's plan is in the exact search's space


@pytest.mark.parametrize("method", ["megatron-grid"])
def test_compare_runs_the_grid_and_reports_its_gap(method):
    rows = api.compare(GPT, "2x4", methods=("exact", method), batch=8)
    grid = next(r for r in rows if r["method"] == method)
    assert grid["gap_to_exact_percent"] is not None and grid["gap_to_exact_percent"] >= 0
