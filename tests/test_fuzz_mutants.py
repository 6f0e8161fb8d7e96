"""Each invariant of ``tests/fuzz_invariants.py`` against a deliberately broken build: the check
must fail on it (an invariant that a broken planner passes would guard nothing)."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_invariants as inv
from planner import api, methods
from planner.cost.settings import TrainingSettings
from planner.plans import Plan
from strategies_gen import COMPUTE_BOUND, graphs

TINY = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128"


def _plan(tmp_path: Path, *extra: str) -> tuple[list[str], Path]:
    path = tmp_path / "p.json"
    argv = [
        "plan",
        "--model",
        TINY,
        "--mesh",
        "2x2",
        "--batch",
        "8",
        "--json",
        str(path),
        "--no-timings",
        *extra,
    ]
    code, _, err = inv.cli(*argv)
    assert code == 0, err
    return argv, path


def test_a_refusal_of_two_lines_is_caught(monkeypatch):
    from planner.errors import PlannerError

    monkeypatch.setattr(PlannerError, "__str__", lambda self: self.args[0] + "\n  (more detail)")
    code, _, err = inv.cli("plan", "--model", "gpt2-smal")
    with pytest.raises(AssertionError, match="lines"):
        inv.refusal_is_one_line(code, err)


def test_an_evaluate_that_drops_a_cost_term_is_caught(tmp_path, monkeypatch):
    """Mutant: `evaluate --plan` re-costs every plan one integer unit (an edge term) cheaper."""
    _, path = _plan(tmp_path)
    real = api.make_plan

    def cheaper(problem, strategies, **kwargs):
        plan = real(problem, strategies, **kwargs)
        return (
            replace(plan, objective=plan.objective - 1)
            if kwargs.get("method") == "evaluate"
            else plan
        )

    monkeypatch.setattr(api, "make_plan", cheaper)
    with pytest.raises(AssertionError, match="objective"):
        inv.recost_agrees(path, tmp_path)


def test_a_status_forced_to_optimal_is_caught(monkeypatch):
    """Mutant: the exact method returns the greedy plan and calls it OPTIMAL."""
    from planner.search.fallback import greedy_result

    monkeypatch.setattr(
        methods,
        "solve_exact",
        lambda problem, memory_limit, *a, **k: (
            replace(
                greedy_result(problem, memory_limit, 0.0),
                status="OPTIMAL",
                bound=greedy_result(problem, memory_limit, 0.0).objective,
            ),
            (),
        ),
    )
    caught = []

    @settings(
        max_examples=30,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(graphs(min_ops=3, max_ops=5), st.sampled_from(("4", "2x2")))
    def check(graph, mesh):
        problem = api.make_problem(
            graph, api.make_cluster(mesh, COMPUTE_BOUND, math.inf), TrainingSettings()
        )
        if math.prod(len(t.strategies) for t in problem.ops) > inv.BRUTE_LIMIT:
            return
        try:
            inv.status_is_earned(
                api.plan_problem(problem, math.inf, "exact").to_dict(), problem, math.inf, {}
            )
        except AssertionError:
            caught.append(graph.name)

    check()
    assert caught, "no generated case told the greedy plan from the optimum"


def test_a_plan_that_claims_to_fit_is_caught(tmp_path, monkeypatch):
    """Mutant: every plan says it fits its memory limit."""
    monkeypatch.setattr(Plan, "fits_memory", property(lambda self: True))
    argv, path = _plan(tmp_path, "--method", "dp", "--memory", "1MB")
    with pytest.raises(AssertionError, match="fits"):
        inv.fits_are_true(0, json.loads(path.read_text()), path)


def test_an_option_made_a_no_op_is_caught(tmp_path, monkeypatch):
    """Mutant: `--optimizer` is parsed and then ignored."""
    from planner.cli import commands

    real = commands._settings
    monkeypatch.setattr(
        commands, "_settings", lambda args, base=None: replace(real(args, base), optimizer="adam")
    )
    import test_fuzz

    base = test_fuzz._evaluate(tmp_path, "base.json", [])
    varied = test_fuzz._evaluate(tmp_path, "varied.json", ["--optimizer", "sgd"])
    with pytest.raises(AssertionError, match="changed nothing"):
        inv.option_changes_result(base[1], varied[1], varied[0], "--optimizer sgd", base[0])


def test_a_time_limit_note_on_an_optimal_plan_is_caught(tmp_path, monkeypatch):
    """Mutant: an OPTIMAL result keeps a stale "the time limit ended the search" note."""
    real = methods.solve_exact
    monkeypatch.setattr(
        methods,
        "solve_exact",
        lambda *a, **k: (
            lambda r: (r[0], r[1] + ("memory binds: the time limit ended the search",))
        )(real(*a, **k)),
    )
    _, path = _plan(tmp_path)
    written = json.loads(path.read_text())
    assert written["status"] == "OPTIMAL"
    with pytest.raises(AssertionError, match="time limit"):
        inv.notes_agree_with_status(written)


def test_a_plan_file_that_differs_between_runs_is_caught(tmp_path, monkeypatch):
    """Mutant: the plan JSON carries a run counter (as a timestamp would)."""
    counter = itertools.count()
    real = Plan.to_dict
    monkeypatch.setattr(
        Plan, "to_dict", lambda self, timings=True: {**real(self, timings), "run": next(counter)}
    )
    argv, path = _plan(tmp_path)
    with pytest.raises(AssertionError, match="other bytes"):
        inv.same_bytes(argv, path, path.read_bytes())


def test_a_consumer_that_trusts_an_edited_plan_is_caught(tmp_path, monkeypatch):
    """Mutant: `show` no longer checks the recorded figures against the re-costed plan."""
    from planner.cli import recost

    monkeypatch.setattr(recost, "check_recorded", lambda *a, **k: None)
    _, path = _plan(tmp_path)
    data = json.loads(path.read_text())
    data["estimated_step_time_s"] *= 2
    edited = tmp_path / "e.json"
    edited.write_text(json.dumps(data))
    with pytest.raises(AssertionError, match="edited plan"):
        inv.consumers_check_the_plan(edited, ("show",))
