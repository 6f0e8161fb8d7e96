"""Every experiment script at its smallest setting, and an experiment killed midway then resumed."""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from experiments.__main__ import SCRIPTS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", SCRIPTS)
def test_smallest_setting_writes_csv_and_png(tmp_path, name):
    out = tmp_path / f"{name}.csv"
    assert (
        importlib.import_module(f"experiments.{name}").main(["--smallest", "--out", str(out)]) == 0
    )
    frame = pd.read_csv(out)
    assert len(frame) > 0 and "status" in frame.columns
    # provenance: the commit the rows were computed at and the command that reproduces them
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    assert set(frame["commit"]) == {frame["commit"][0]} and str(frame["commit"][0]).startswith(
        head.stdout.strip()
    )
    command = str(frame["command"][0])
    assert (
        command.startswith(f"python -m experiments.{name} ")
        and "--smallest" in command
        and str(out) in command
    )
    pytest.importorskip("matplotlib")
    assert out.with_suffix(".png").stat().st_size > 1000


def test_fidelity_summary_rows_are_computed(tmp_path):
    out = tmp_path / "f.csv"
    importlib.import_module("experiments.fidelity").main(
        ["--smallest", "--out", str(out), "--no-plot"]
    )
    frame = pd.read_csv(out)
    summary = dict(
        zip(frame[frame.source == "summary"].config, frame[frame.source == "summary"].value)
    )
    assert summary["fig13_b128_predicted_best"] == "p8-t8"
    assert -1.0 <= float(summary["fig13_b128_spearman"]) <= 1.0


def test_memory_bound_decide_adds_rows_where_memory_binds_and_refuses_unknown_choices(tmp_path):
    """--decide: GPT-3 6.7B on 8 devices binds at 80 GB, so the ZeRO row is added,
    and its per-layer stages beat the default plan; mlp does not bind, so it gets no ZeRO row."""
    script = importlib.import_module("experiments.memory_bound")
    out = tmp_path / "mb.csv"
    gpt = "gpt3-6.7b"
    assert (
        script.main(
            [
                "--models",
                f"mlp,{gpt}",
                "--meshes",
                "8",
                "--decide",
                "none,zero",
                "--whole-limit",
                "0",
                "--no-plot",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    frame = pd.read_csv(out)
    assert sorted(frame[frame.model == "mlp"].decide) == ["none"]
    rows = frame[frame.model == gpt].set_index("decide")
    assert sorted(rows.index) == ["none", "zero"] and rows.loc["zero", "layer_zero"]
    assert rows.loc["zero", "objective"] < rows.loc["none", "objective"]
    with pytest.raises(SystemExit) as refused:
        script.main(["--decide", "none,everything", "--out", str(tmp_path / "x.csv")])
    assert refused.value.code == 2


def _rows(path: Path) -> int:
    return len(pd.read_csv(path)) if path.exists() else 0


@pytest.mark.slow  # 12-26 s on 2 cores: the default run keeps a faster test of the same path
def test_killed_experiment_leaves_a_complete_csv_and_resumes(tmp_path):
    out = tmp_path / "pipe.csv"
    cmd = [
        sys.executable,
        "-m",
        "experiments.pipeline",
        "--instances",
        "40",
        "--big",
        "",
        "--zoo",
        "",
        "--no-plot",
        "--out",
        str(out),
    ]
    # the rows so far; pipe.csv itself only once the run ends
    partial = tmp_path / "pipe.csv.partial"
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while _rows(partial) < 8 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists(), "an unfinished run wrote the results CSV"
    killed_rows = _rows(partial)  # absent or loadable, never truncated
    assert 8 <= killed_rows < 160, "the run was not interrupted midway"
    assert killed_rows % 4 == 0  # whole instances only (4 methods each)
    before = pd.read_csv(partial)
    done = subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    after = pd.read_csv(out)
    assert len(after) == 160 and sorted(set(after["instance"])) == list(range(40))
    pd.testing.assert_frame_equal(after.iloc[:killed_rows], before)  # kept rows untouched
    fresh = tmp_path / "fresh.csv"
    subprocess.run(
        cmd[:-2] + ["--out", str(fresh)], cwd=ROOT, check=True, capture_output=True, timeout=600
    )
    reference = pd.read_csv(fresh)
    # resume changes nothing
    pd.testing.assert_series_equal(after["objective"], reference["objective"])


def test_check_passes_on_the_committed_rows_and_fails_on_an_edited_objective(tmp_path):
    """`python -m experiments check` re-runs a slice and compares it with results/: the committed
    rows agree with the code, and one objective edited by hand is caught."""
    from experiments import check

    committed = pd.read_csv(ROOT / "results" / "sapp_scaling.csv")
    (tmp_path / "sapp_scaling.csv").write_text(committed.to_csv(index=False))
    assert check.main(["--only", "sapp_scaling", "--results", str(tmp_path)]) == 0
    edited = committed.copy()
    rows = (edited["layers"] == 12) & (edited["devices"] == 8)
    assert rows.any()
    edited.loc[rows, "objective"] = edited.loc[rows, "objective"].astype(int) + 1
    (tmp_path / "sapp_scaling.csv").write_text(edited.to_csv(index=False))
    assert check.main(["--only", "sapp_scaling", "--results", str(tmp_path)]) == 1


def test_verify_batches_and_methods_choose_the_rows(tmp_path):
    """--batches verifies each model at those global batches, --methods restricts the plans; both
    refuse what they do not know (exit 2)."""
    pytest.importorskip("jax")
    script = importlib.import_module("experiments.verify")
    out = tmp_path / "v.csv"
    assert (
        script.main(
            [
                "--models",
                "mlp",
                "--meshes",
                "4",
                "--methods",
                "megatron",
                "--batches",
                "64,128",
                "--no-plot",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    frame = pd.read_csv(out)
    assert sorted(frame["batch"]) == [64, 128] and set(frame["method"]) == {"megatron"}
    assert frame["predicted_bytes"].nunique() == 2  # the plans' activations scale with the batch
    for bad in (["--methods", "sapp"], ["--batches", "0"], ["--models", "resnet"]):
        with pytest.raises(SystemExit) as refused:
            script.main([*bad, "--out", str(tmp_path / "x.csv")])
        assert refused.value.code == 2


def test_regression_benchmark_compares_with_the_committed_figures_wherever_it_writes(tmp_path):
    """``benchmarks/regress.py --out ELSEWHERE`` still prints the committed figure beside each one
    (it read the committed rows from the --out path, and printed "committed None")."""
    out = tmp_path / "regress.csv"
    done = subprocess.run(
        [sys.executable, "benchmarks/regress.py", "--cases", "zero3-384", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    import pandas as pd

    rows = pd.read_csv(ROOT / "results" / "bench_regress.csv")
    figure = rows.loc[rows["case"] == "zero3-384", "figure"].iloc[0]
    line = next(x for x in done.stdout.splitlines() if x.startswith("zero3-384"))
    assert "committed None" not in line and f"(committed {figure})" in line, line
    assert "committed_figure" in out.read_text()
