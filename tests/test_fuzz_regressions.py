"""Defects the fuzz suite found, each kept with the (minimised) generated input that found it."""

from __future__ import annotations

import math

import json

import pytest

import fuzz_invariants as inv
from planner import api
from planner.search.brute import brute_force

TINY = "gpt:layers=2,hidden=16,heads=2,seq=8,vocab=32"
TABLE = (
    "device,peak_bf16_flops,hbm_bytes,hbm_bandwidth,intra_node_link,"
    "intra_node_bandwidth,gpus_per_node,"
    "inter_node_link,inter_node_bandwidth_per_gpu,sm_count,fp32_vector_flops\n"
    "fuzzdev,1e12,80e9,900e9,nvlink,150e9,2,ib,0.39e9,100,20e12\n"
)


def test_brute_force_on_a_one_device_mesh_with_more_than_32_operators():
    """Found by generated topologies (mesh ``1``, the 2-layer GPT of 33 operators): brute force
    raised "only supports up to 32 dimensions" although there is one combination. Operators with
    one strategy are constants now."""
    problem = api.make_problem(TINY, api.make_cluster("1", "a100-80g"), batch=2)
    assert len(problem.ops) > 32
    objective, choice = brute_force(problem)
    assert (
        objective
        == problem.objective(choice)
        == api.plan_problem(problem, math.inf, "exact").objective
    )
    # the same enumeration with free operators among constant ones: a 2-device mesh, capped
    small = api.make_problem("mlp", api.make_cluster("2", "a100-80g"), batch=8)
    objective, choice = brute_force(small)
    assert (
        objective == small.objective(choice) == api.plan_problem(small, math.inf, "exact").objective
    )


def test_a_plan_made_with_a_datasheet_table_re_costs(tmp_path):
    """Found by generated topologies (a one-row ``--hardware`` table, device ``fuzzdev``): the plan
    was written, but ``evaluate --plan``, ``verify`` and the API could not find its device. The
    plan records the table's path in ``source.hardware``."""
    (tmp_path / "t.csv").write_text(TABLE)
    plan = tmp_path / "p.json"
    code, _, err = inv.cli(
        "plan",
        "--model",
        TINY,
        "--batch",
        "4",
        "--mesh",
        "gpu=2,a0=2",
        "--device",
        "fuzzdev",
        "--hardware",
        tmp_path / "t.csv",
        "--json",
        plan,
        "--no-timings",
        "-q",
    )
    assert code == 0, err
    assert json.loads(plan.read_text())["source"]["hardware"] == str(tmp_path / "t.csv")
    inv.recost_agrees(plan, tmp_path)
    code, _, err = inv.cli("verify", "--plan", plan, "--no-xla")
    assert code == 0, err
    data = json.loads(plan.read_text())
    data["source"]["hardware"] = 7
    (tmp_path / "e.json").write_text(json.dumps(data))
    code, _, err = inv.cli("evaluate", "--plan", tmp_path / "e.json")
    assert code == 2 and "source.hardware" in err


@pytest.mark.parametrize(
    "argv,option",
    [
        # every run would fail whatever it measured
        (["verify", "--tolerance", "-1"], "--tolerance"),
        (["run-jax", "--tolerance", "-0.5"], "--tolerance"),
        (["verify", "--no-xla", "--no-numpy"], "--no-xla"),  # checked nothing and exited 0
    ],
)
def test_consumer_options_that_could_not_check_anything_are_refused(tmp_path, argv, option):
    """Found by the consumer option fuzz (pairs of verify/run-jax options on a 2-device plan)."""
    plan = tmp_path / "p.json"
    assert (
        inv.cli("plan", "--model", TINY, "--batch", "4", "--mesh", "2", "--json", plan, "-q")[0]
        == 0
    )
    code, out, err = inv.cli(*argv, "--plan", plan)
    inv.refusal_is_one_line(code, err)
    assert code == 2 and option in err and out == ""
