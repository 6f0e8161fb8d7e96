"""The time-memory front (``planner pareto``): the exact search under a tightening limit gives
exactly the front that enumerating every combination gives, point for point."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from planner import api
from planner.cost.settings import TrainingSettings
from planner.errors import SettingsError
from planner.front import _search_memory, pareto_front
from planner.search.brute import brute_front

MLP = "mlp:hidden=512"  # batch 1024: its fastest plan shards every operator on 2x2
GPT = "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=1024"


@pytest.mark.parametrize("mesh", ["2x2", "4"])
def test_the_front_equals_brute_force(mesh):
    cluster = api.make_cluster(mesh, "a100-80g")
    problem = api.make_problem(MLP, cluster, None, 1024)
    expected = brute_front(problem, cluster.memory_limit)
    assert len(expected) >= 3  # a front, not one point: memory and time trade
    front = pareto_front(MLP, mesh, batch=1024, max_points=len(expected) + 10)
    assert front.complete
    got = [(p.objective, _search_memory(problem, p)) for p in front.plans]
    assert got == expected


def test_a_tighter_limit_starts_the_front_lower():
    whole = pareto_front(MLP, "2x2", batch=1024, max_points=50)
    limit = whole.plans[len(whole.plans) // 2].memory_per_device_bytes
    part = pareto_front(MLP, "2x2", batch=1024, memory=limit, max_points=50)
    assert [p.objective for p in part.plans] == [p.objective for p in whole.plans][
        len(whole.plans) // 2 :
    ]


def test_per_layer_choices_trade_time_for_memory():
    front = pareto_front(
        GPT, "2x2", batch=8, settings=TrainingSettings(recompute="auto"), max_points=4
    )
    assert not front.complete and "--max-points" in front.why and front.searches == 4
    times = [p.objective for p in front.plans]
    memory = [p.memory_per_device_bytes for p in front.plans]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert memory == sorted(memory, reverse=True) and len(set(memory)) == len(memory)
    assert all(p.status == "OPTIMAL" for p in front.plans)
    with pytest.raises(SettingsError, match="max_points"):
        pareto_front(GPT, "2x2", max_points=0)


def test_the_command_writes_the_front(tmp_path):
    out = tmp_path / "front.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner",
            "pareto",
            "--model",
            MLP,
            "--mesh",
            "2x2",
            "--batch",
            "1024",
            "--max-points",
            "3",
            "--json",
            str(out),
            "--csv",
            str(tmp_path / "f.csv"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["format"] == "planner-front/1" and data["searches"] == 3
    assert len(data["points"]) >= 2 and "front points from 3 searches (cut" in done.stdout
    times = [p["estimated_step_time_s"] for p in data["points"]]
    assert times == sorted(times) and math.isfinite(times[0])
