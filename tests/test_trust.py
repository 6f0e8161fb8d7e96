"""Regressions of "Trust at HEAD": each test failed on the commit before its fix."""

import csv
import json
import math
import subprocess
import sys

import pytest

from planner import api
from planner.errors import SettingsError
from planner.search.prices import priced_bound
from planner.search.result import SolveResult
from planner.search.ties import solve_tied


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=cwd
    )


def test_layer_choices_without_a_memory_limit_plan(tmp_path):
    """`--memory none --zero auto` compared the plan's memory with None (TypeError)."""
    run = _cli(
        "plan",
        "--model",
        "gpt2-small",
        "--mesh",
        "8",
        "--memory",
        "none",
        "--zero",
        "auto",
        "--json",
        "p.json",
        "--no-timings",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["status"] == "OPTIMAL" and data["memory_limit_bytes"] is None
    assert data["settings"]["zero"] == "auto" and data["settings"]["layer_zero"]


def test_the_api_refuses_a_mesh_beside_degrees():
    """`evaluate(model, "this is not a mesh", tp=2, dp=4)` returned a plan on dp=4,tp=2."""
    with pytest.raises(SettingsError, match="--mesh"):
        api.evaluate("gpt2-small", "this is not a mesh", "a100-80g", tp=2, dp=4)
    with pytest.raises(SettingsError, match="--mesh"):
        api.evaluate("gpt2-small", "2x4", tp=2, dp=4)
    with pytest.raises(SettingsError, match="--mesh: required"):
        api.evaluate("gpt2-small", assignment={})
    assert api.evaluate("gpt2-small", tp=2, dp=4).mesh == "dp=4,tp=2"


def test_a_failed_search_carries_no_figures(tmp_path):
    """An INFEASIBLE result had the replicated plan's objective, time and memory in JSON and CSV."""
    failed = api.plan("mlp", mesh="8", memory=1024.0)
    assert failed.status == "INFEASIBLE" and not failed.found and failed.explanation
    data = failed.to_dict()
    for key in (
        "objective",
        "estimated_step_time_s",
        "compute_s",
        "comm_s",
        "hidden_s",
        "memory_per_device_bytes",
        "fits_memory",
    ):
        assert data[key] is None, key
    assert data["operators"] == [] and data["memory_breakdown_bytes"] == {}
    rows = api.compare("mlp", "8", methods=("exact", "dp"), memory=1024.0)
    exact = next(r for r in rows if r["method"] == "exact")
    assert (
        exact["objective"] is None
        and exact["estimated_step_time_s"] is None
        and exact["gap_to_exact_percent"] is None
    )
    run = _cli(
        "plan",
        "--model",
        "mlp",
        "--mesh",
        "8",
        "--memory",
        "1024",
        "--csv",
        "p.csv",
        "--json",
        "p.json",
        cwd=tmp_path,
    )
    assert run.returncode != 0 and not (tmp_path / "p.json").exists()
    row = next(csv.DictReader((tmp_path / "p.csv").open()))
    assert row["status"] == "INFEASIBLE"
    assert row["objective"] == row["estimated_step_time_s"] == row["memory_per_device_bytes"] == ""
    assert "no plan found" in run.stdout and "estimated step time" not in run.stdout


def test_a_bound_at_a_huge_price_is_no_bound():
    """At price 4^80 both sides of ``total - price * limit`` are ~1e50: the float difference once
    read 9.5e44 as a lower bound of a plan costing 5e9. The rounding error is taken off."""
    price, limit, true_value = 4.0**80, 8e10, 5e9
    total = price * limit + true_value  # the last digits are lost to rounding
    assert priced_bound(total, price * limit, 20_000) <= true_value
    # at an ordinary price the bound keeps its integer precision
    assert priced_bound(1.23e9 + 0.5 * 8e10, 0.5 * 8e10, 20_000) == pytest.approx(1.23e9, abs=2.0)


def test_an_optimal_tied_result_says_nothing_of_an_earlier_time_limit():
    """A condition that ran into its first-sweep time share and was settled in the second sweep
    left "the time limit ended the search" in an OPTIMAL result's notes."""
    problem = api.make_problem(
        "gpt:layers=1,hidden=64,heads=4,seq=16,vocab=128", api.make_cluster("4")
    )
    assert problem.ties
    calls = []

    def solve_untied(untied, limit, incumbent):
        calls.append(untied.conditions)
        choice = tuple(0 for _ in untied.ops)
        value = untied.objective(choice)
        if len(calls) == 1:  # the first attempt runs out of its share: a plan, not yet proven
            return (
                SolveResult("FEASIBLE", value, value // 2, choice, 0.0, 0),
                ("memory binds: 100% above the bound; the time limit ended the search",),
            )
        return SolveResult("OPTIMAL", value, value, choice, 0.0, 0), ("solved by a fake search",)

    result, notes = solve_tied(problem, None, 60.0, 0, solve_untied)
    conditions = len(set(calls))
    assert conditions >= 2 and len(calls) == conditions + 1  # the first condition tried twice
    assert result.status == "OPTIMAL"
    assert not any("time limit" in n for n in notes), notes


def test_zero3_bucket_rule_is_stated_in_the_module():
    from planner.cost import operators

    assert "a tensor larger than a bucket is" in operators.__doc__
    assert math.isclose(operators.bucket_share(100.0, 25.0), 1.0)
    assert math.isclose(operators.bucket_share(5.0, 25.0), 0.2)
    assert operators.bucket_share(5.0, 0.0) == 1.0
