"""The command line through a subprocess: plan with JSON and CSV, evaluate, exit codes."""

import json
import subprocess
import sys

import pandas as pd
import pytest


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "planner", *args], capture_output=True, text=True, timeout=600
    )


def test_plan_writes_json_and_csv(tmp_path):
    out_json, out_csv = tmp_path / "plan.json", tmp_path / "plan.csv"
    proc = run(
        "plan",
        "--model",
        "gpt2-small",
        "--mesh",
        "8",
        "--device",
        "a100-80g",
        "--json",
        str(out_json),
        "--csv",
        str(out_csv),
    )
    assert proc.returncode == 0, proc.stderr
    assert "OPTIMAL" in proc.stdout and "estimated step time" in proc.stdout
    data = json.loads(out_json.read_text())
    for key in (
        "status",
        "method",
        "objective",
        "estimated_step_time_s",
        "search_time_s",
        "memory_per_device_bytes",
        "mesh",
        "device",
        "operators",
    ):
        assert key in data
    assert data["status"] == "OPTIMAL" and data["method"] == "exact"
    assert {"name", "strategy"} <= set(data["operators"][0])
    row = pd.read_csv(out_csv)
    assert len(row) == 1 and row["objective"][0] == data["objective"]


def test_evaluate_plan_file_reproduces_objective(tmp_path):
    out_json = tmp_path / "plan.json"
    assert run("plan", "--model", "mlp", "--mesh", "2x4", "--json", str(out_json)).returncode == 0
    again = tmp_path / "again.json"
    proc = run(
        "evaluate", "--model", "mlp", "--mesh", "2x4", "--plan", str(out_json), "--json", str(again)
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        json.loads(again.read_text())["objective"] == json.loads(out_json.read_text())["objective"]
    )


def test_evaluate_megatron_degrees(tmp_path):
    out_csv = tmp_path / "m.csv"
    proc = run("evaluate", "--model", "gpt2-small", "--tp", "4", "--dp", "2", "--csv", str(out_csv))
    assert proc.returncode == 0, proc.stderr
    row = pd.read_csv(out_csv)
    assert row["mesh"][0] == "pp=1,dp=2,tp=4" and row["stage_mesh"][0] == "dp=2,tp=4"
    assert (
        row["num_microbatches"][0] == 1
        and row["iteration_time_s"][0] > 0
        and row["intra_method"][0] == "megatron"
    )


@pytest.mark.parametrize(
    "args,field",
    [
        (("plan", "--model", "gpt2-smal"), "--model"),
        (("plan", "--model", "mlp", "--device", "a100"), "--device"),
        (("plan", "--model", "mlp", "--mesh", "8y"), "--mesh"),
        (("plan", "--model", "mlp", "--memory", "-5"), "--memory"),
        (("plan", "--model", "mlp", "--batch", "0"), "--batch"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, field):
    proc = run(*args)
    assert proc.returncode == 2
    assert field in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_infeasible_exits_3():
    proc = run("plan", "--model", "gpt2-small", "--memory", "1MiB")
    assert proc.returncode == 3
    assert "memory" in proc.stderr


def test_same_command_twice_gives_identical_json(tmp_path):
    outs = []
    for k in range(2):
        out = tmp_path / f"p{k}.json"
        assert (
            run(
                "plan", "--model", "bert-base", "--mesh", "2x4", "--no-timings", "--json", str(out)
            ).returncode
            == 0
        )
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert b"search_time_s" not in outs[0]


def test_compare_writes_one_row_per_method(tmp_path):
    out_csv = tmp_path / "cmp.csv"
    proc = run(
        "compare",
        "--model",
        "mlp",
        "--mesh",
        "8",
        "--methods",
        "exact,sapp,drec-cost,dp,megatron,greedy,zero",
        "--csv",
        str(out_csv),
    )
    assert proc.returncode == 0, proc.stderr
    rows = pd.read_csv(out_csv)
    assert list(rows["method"]) == [
        "exact",
        "sapp",
        "drec-cost",
        "dp",
        "megatron",
        "greedy",
        "zero",
    ]
    # zero runs ZeRO-3: other settings, possibly cheaper
    same_settings = rows[rows["method"] != "zero"]
    assert (same_settings["gap_to_exact_percent"] >= 0).all() and len(same_settings) == 6


def test_time_limited_whole_program_returns_feasible_plan(tmp_path):
    """gpt2-small on 2x4 takes ~35 s to prove optimal; a 2 s limit returns the best plan found, not
    an error."""
    out = tmp_path / "w.json"
    proc = run(
        "plan",
        "--model",
        "gpt2-small",
        "--mesh",
        "2x4",
        "--method",
        "whole",
        "--time-limit",
        "2",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["status"] == "FEASIBLE" and len(data["operators"]) > 100
    assert "not proven optimal" in proc.stderr
    strict = run(
        "plan",
        "--model",
        "gpt2-small",
        "--mesh",
        "2x4",
        "--method",
        "whole",
        "--time-limit",
        "2",
        "--require-optimal",
        "-q",
    )
    assert strict.returncode == 4 and "--require-optimal" in strict.stderr


def test_verify_and_export_a_plan_file(tmp_path):
    pytest.importorskip("jax")
    plan = tmp_path / "p.json"
    assert (
        run(
            "plan",
            "--model",
            "mlp",
            "--batch",
            "512",
            "--mesh",
            "2x4",
            "--method",
            "megatron",
            "--json",
            str(plan),
            "-q",
        ).returncode
        == 0
    )
    proc = run("verify", "--plan", str(plan), "--devices", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "numpy executor" in proc.stdout and "node" in proc.stdout and "gpu" in proc.stdout
    assert proc.stdout.count("plan ") == 1 and proc.stdout.count("collectives compiled") == 1
    # the megatron plan's bytes agree exactly with XLA's, so no tolerance at all still passes; a
    # negative tolerance would fail every run and is refused
    strict = run("verify", "--plan", str(plan), "--tolerance", "0", "--no-numpy")
    assert strict.returncode == 0 and "0.00% ok" in strict.stdout, strict.stdout + strict.stderr
    negative = run("verify", "--plan", str(plan), "--tolerance", "-1", "--no-numpy")
    assert negative.returncode == 2 and "--tolerance" in negative.stderr
    wrong = run("verify", "--plan", str(plan), "--devices", "4", "--no-xla")
    assert wrong.returncode == 2 and "--devices" in wrong.stderr
    shardings = tmp_path / "s.json"
    assert run("export", "--plan", str(plan), "--json", str(shardings)).returncode == 0
    data = json.loads(shardings.read_text())
    assert data["partition_specs"]["fc1.weight"] == [None, "gpu"]
    assert data["parallelize_plan"]["mesh_axis"] == "gpu"
