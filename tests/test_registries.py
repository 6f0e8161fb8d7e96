"""The extension points are registries: a search method (``planner.methods.METHODS``) and a launch
target (``planner.launch.TARGETS``) are each one function and one registration, and every command
that takes a method or an engine accepts the new one."""

from __future__ import annotations

import time

import pytest

from planner import api
from planner.cli.main import main
from planner.errors import SettingsError
from planner.launch import TARGETS, Target, export_megatron, plan_for
from planner.methods import METHODS, Method, heuristic, method, register
from planner.plans import make_plan
from planner.search.baselines import data_parallel

GPT = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128"
# the registry as the docs list it (docs/commands.md: the --method values)
DOCUMENTED = ("exact", "whole", "sapp", "drec-cost", "dp", "zero", "megatron", "greedy")


def test_the_registries_hold_what_the_docs_list():
    assert tuple(METHODS) == DOCUMENTED + ("megatron-grid",)
    assert tuple(TARGETS) == ("megatron", "torchtitan")
    with pytest.raises(SettingsError, match="--method: unknown method 'nope'"):
        method("nope")
    with pytest.raises(SettingsError, match="registered already"):
        register(heuristic("dp", data_parallel))


def test_a_toy_method_is_one_function_and_one_registration(monkeypatch, capsys):
    """A method that replicates every operator: planned through the API and the command line."""

    def replicate(problem, memory_limit, call):
        strategies = [op.strategies[0] for op in problem.ops]  # the first: replicated
        return make_plan(
            problem,
            strategies,
            method="toy",
            status="HEURISTIC",
            memory_limit=memory_limit,
            search_time_s=time.perf_counter() - call.start,
        )

    monkeypatch.delitem(METHODS, "toy", raising=False)
    register(Method("toy", replicate, "every operator replicated"))
    try:
        plan = api.plan(GPT, "4", method="toy", batch=8)
        assert plan.method == "toy" and plan.status == "HEURISTIC"
        exact = api.plan(GPT, "4", method="exact", batch=8)
        assert plan.objective >= exact.objective
        assert main(["plan", "--model", GPT, "--mesh", "4", "--batch", "8", "--method", "toy"]) == 0
        assert "toy" in capsys.readouterr().out
    finally:
        METHODS.pop("toy", None)


def test_a_toy_launch_target_is_one_check_and_one_registration(monkeypatch):
    """An engine that runs two pipeline stages and nothing else: `plan --for` answers two stages
    where Megatron-LM's own search answers one."""

    def two_stages(run):
        if run.pipeline_parallel != 2:
            raise SettingsError("toy: two pipeline stages")

    monkeypatch.setitem(TARGETS, "toy", Target("toy", two_stages, export_megatron))
    assert plan_for("megatron", GPT, "node=2,gpu=2", batch=8).pipeline.stages == 1
    assert plan_for("toy", GPT, "node=2,gpu=2", batch=8).pipeline.stages == 2
