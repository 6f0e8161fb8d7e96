"""plan --top-k: the k best distinct plans in increasing cost, checked against enumerating every
assignment (the k smallest objectives, ties included) and the exact optimum."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from planner import api
from planner.cost.settings import TrainingSettings
from planner.errors import SettingsError
from planner.front import top_plans
from planner.search.brute import _dense

MLP = "mlp:hidden=512"  # batch 1024: its optimum shards every operator on 2x2


@pytest.mark.parametrize("mesh,memory", [("2x2", None), ("4", None), ("2x2", 19_700_000)])
def test_the_k_best_are_the_k_smallest_objectives(mesh, memory):
    cluster = api.make_cluster(mesh, "a100-80g", memory)
    problem = api.make_problem(MLP, cluster, None, 1024)
    total, used, _, _ = _dense(problem, 20_000_000)
    fitting = total.ravel()[used.ravel() <= cluster.memory_limit]
    k = 8
    plans = top_plans(MLP, mesh, k=k, batch=1024, memory=memory)
    assert [p.objective for p in plans] == np.sort(fitting)[:k].tolist()
    assert len({tuple(a.strategy for a in p.operators) for p in plans}) == k  # distinct
    assert all(p.status == "OPTIMAL" for p in plans)
    exact = api.plan(MLP, mesh, batch=1024, memory=memory)
    assert plans[0].objective == exact.objective
    assert any(dim for a in plans[0].operators for _, dim in a.strategy)  # not replicate-all
    if memory is not None:
        assert all(p.memory_per_device_bytes <= memory for p in plans)


def test_fewer_assignments_than_k_gives_them_all():
    plans = top_plans(MLP, "1", k=3, batch=1024)  # one device: one assignment
    assert len(plans) == 1


def test_top_k_refuses_what_it_cannot_rank():
    with pytest.raises(SettingsError, match="k:"):
        top_plans(MLP, "2x2", k=0)
    with pytest.raises(SettingsError, match="--top-k"):
        top_plans(MLP, "2x2", k=2, settings=TrainingSettings(zero="auto"))


@pytest.mark.slow  # five whole-graph programs of gpt2-small on 2x4: about 90 s
@pytest.mark.heavy
def test_five_best_gpt2_small_plans_on_2x4():
    plans = top_plans("gpt2-small", "2x4", k=5)
    assert len(plans) == 5 and all(p.status == "OPTIMAL" for p in plans)
    objectives = [p.objective for p in plans]
    assert objectives == sorted(objectives)
    assert len({tuple(a.strategy for a in p.operators) for p in plans}) == 5
    assert objectives[0] == api.plan("gpt2-small", "2x4").objective
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner",
            "plan",
            "--model",
            MLP,
            "--mesh",
            "2x2",
            "--batch",
            "64",
            "--top-k",
            "2",
            "--pipeline",
            "auto",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--top-k" in done.stderr and math.isfinite(objectives[-1])
