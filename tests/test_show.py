"""`planner show`: pictures of a zoo plan, a 3D plan and an imported graph's plan, checked from the
figure's artists (bar heights against the plan's step time and memory, Gantt blocks against
stages x micro-batches x passes) and from the PNG written; the schedule simulation against the
cost model's closed form; text fallbacks and plans from the previous release."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("matplotlib")

from planner.cli import main  # noqa: E402
from planner.pipeline.timeline import StageDetail, makespan, simulate  # noqa: E402
from planner.show import draw  # noqa: E402
from planner.show.view import load_view  # noqa: E402

GPT = "gpt:layers=4,hidden=256,heads=4,seq=64,vocab=512"


def _plan(tmp: Path, name: str, *argv: str) -> Path:
    path = tmp / name
    assert main(["plan", *argv, "--json", str(path), "-q"]) == 0
    return path


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("show")
    return {
        "zoo": _plan(tmp, "zoo.json", "--model", "gpt2-small", "--mesh", "2x4"),
        "3d": _plan(
            tmp,
            "p3.json",
            "--model",
            GPT,
            "--mesh",
            "4x2",
            "--batch",
            "16",
            "--pipeline",
            "auto",
            "--pp",
            "2",
            "--num-microbatches",
            "4",
        ),
        # interleaved:2 on 4 stages: two layers per stage, one per chunk (a stage needs a layer per
        # chunk)
        "3d-recompute": _plan(
            tmp,
            "p3r.json",
            "--model",
            GPT.replace("layers=4", "layers=8"),
            "--mesh",
            "4x2",
            "--batch",
            "16",
            "--pipeline",
            "auto",
            "--pp",
            "4",
            "--num-microbatches",
            "8",
            "--recompute",
            "full",
            "--schedule",
            "interleaved:2",
            "--cuts",
            "2,4,6",
        ),
    }


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _expected_size(view, what) -> tuple[int, int]:
    return round(draw.WIDTH_IN * draw.DPI), round(sum(draw.panel_heights(view, what)) * draw.DPI)


def _patches(fig, prefix: str) -> list:
    return [p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith(prefix)]


@pytest.mark.parametrize("kind", ["zoo", "3d", "3d-recompute"])
def test_every_picture_renders_a_png_of_the_expected_size(plans, kind, tmp_path):
    out = tmp_path / "plan.png"
    assert main(["show", "--plan", str(plans[kind]), "--png", str(out), "-q"]) == 0
    view = load_view(str(plans[kind]))
    assert _png_size(out.read_bytes()) == _expected_size(view, draw.WHAT)
    for what in draw.WHAT:
        assert (
            main(["show", "--plan", str(plans[kind]), "--what", what, "--png", str(out), "-q"]) == 0
        )
        assert _png_size(out.read_bytes()) == _expected_size(view, (what,))


def test_flat_step_bars_add_up_to_the_step_time_and_memory(plans):
    data = json.loads(plans["zoo"].read_text())
    fig = draw.plan_figure(load_view(str(plans["zoo"])))
    step = sum(p.get_width() for p in _patches(fig, "step:")) / 1e3
    assert step == pytest.approx(data["estimated_step_time_s"], rel=1e-3)
    comm = sum(p.get_width() for p in _patches(fig, "comm:")) / 1e3
    assert comm == pytest.approx(data["comm_s"], rel=1e-3)
    memory = sum(p.get_height() for p in _patches(fig, "memory:")) * 2**30
    assert memory == pytest.approx(data["memory_per_device_bytes"], rel=1e-3)


@pytest.mark.parametrize("kind,passes", [("3d", 2), ("3d-recompute", 3)])
def test_gantt_blocks_and_stage_memory_match_the_plan(plans, kind, passes):
    data = json.loads(plans[kind].read_text())
    pipe = data["pipeline"]
    chunks = int(pipe["schedule"].partition(":")[2] or 1)
    fig = draw.plan_figure(load_view(str(plans[kind])))
    blocks = [p for name in ("forward", "backward", "recompute") for p in _patches(fig, name)]
    assert len(blocks) == pipe["stages"] * pipe["num_microbatches"] * passes * chunks
    assert len(_patches(fig, "sync")) == pipe["stages"]
    for k, stage in enumerate(data["stages"]):
        heights = [
            p.get_height()
            for p in _patches(fig, "memory:")
            if round(p.get_x() + p.get_width() / 2) == k
        ]
        assert sum(heights) * 2**30 == pytest.approx(stage["memory_bytes"], rel=1e-3)
    # each stage's blocks of one micro-batch add up to its time per micro-batch (sends and exposed
    # comm included)
    busy = sum(
        p.get_width()
        for p in _patches(fig, "")
        if p.get_gid() in ("forward", "backward", "recompute", "comm")
    )
    per_stage = sum(s["time_per_microbatch_s"] for s in data["stages"]) * pipe["num_microbatches"]
    assert busy / 1e3 == pytest.approx(per_stage, rel=1e-3)


def test_stage_terms_add_up_to_the_stage_times(plans):
    for kind in ("3d", "3d-recompute"):
        view = load_view(str(plans[kind]))
        data = json.loads(plans[kind].read_text())
        for detail, stage in zip(view.stages(), data["stages"]):
            assert detail.time_per_microbatch_s == pytest.approx(
                stage["time_per_microbatch_s"], rel=1e-9
            )
            assert detail.memory_bytes == pytest.approx(stage["memory_bytes"], rel=1e-9)
        assert any(d.recompute_s > 0 for d in view.stages()) == (kind == "3d-recompute")


def test_simulated_iteration_equals_the_cost_model_on_a_searched_plan(plans):
    view = load_view(str(plans["3d"]))
    schedule, _, count = view.pipeline()
    blocks = simulate(view.stages(), schedule, count, view.data["tied_sync_s"])
    assert makespan(blocks) == pytest.approx(view.step_time_s, rel=1e-9)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    stages=st.integers(1, 5),
    groups=st.integers(1, 4),
    chunks=st.integers(1, 3),
    fwd=st.floats(0.1, 3),
    bwd=st.floats(0.1, 3),
    fwd_comm=st.floats(0, 1),
    sync=st.floats(0, 1),
    gpipe=st.booleans(),
)
def test_simulation_of_identical_stages_equals_the_closed_form(
    stages, groups, chunks, fwd, bwd, fwd_comm, sync, gpipe
):
    """sum_k T_k / v + (M - 1/v) max_k T_k + sync, for GPipe, 1F1B and interleaved (M a multiple of
    p)."""
    schedule = (
        "gpipe" if gpipe and chunks == 1 else "1f1b" if chunks == 1 else f"interleaved:{chunks}"
    )
    count = groups * stages
    details = tuple(
        StageDetail(k, k, k + 1, fwd, bwd, 0.0, fwd_comm, 0.0, 0.0, 0.0, sync, 0, 0, 0, 0, 0, 0)
        for k in range(stages)
    )
    times = [d.time_per_microbatch_s for d in details]
    closed = sum(times) / chunks + (count - 1 / chunks) * max(times) + sync
    assert makespan(simulate(details, schedule, count)) == pytest.approx(closed, rel=1e-9)


def test_sharding_grid_folds_identical_layers(plans):
    view = load_view(str(plans["zoo"]))
    groups = view.layer_groups()
    assert [g.label for g in groups] == [
        "before the layers",
        "layers 0-11 (12 identical)",
        "after the layers",
    ]
    fig = draw.plan_figure(view, ("sharding",))
    cells = [t for t in fig.axes[0].texts if t.get_gid() == "cell"]
    assert len(cells) == sum(len(g.rows) for g in groups) * len(view.axes)
    ops = json.loads(plans["zoo"].read_text())["operators"]
    first = next(o for o in ops if o["layer"] == 0)
    assert [c.get_text() for c in cells[len(groups[0].rows) * 2 :][:2]] == [
        first["strategy"][a] or "-" for a in view.axes
    ]


def test_text_fallback_prints_the_same_tables(plans, capsys):
    assert main(["show", "--plan", str(plans["3d"]), "--text"]) == 0
    out = capsys.readouterr().out
    assert "stage" in out and "memory per device" in out and "layers 0-3" in out
    data = json.loads(plans["3d"].read_text())
    assert f"cost model {data['iteration_time_s'] * 1e3:.2f} ms" in out


def test_without_matplotlib_a_picture_names_the_extra(plans, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert main(["show", "--plan", str(plans["zoo"]), "--png", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "planner[plot]" in err and len(err.strip().splitlines()) == 1
    # tables need no matplotlib
    assert main(["show", "--plan", str(plans["zoo"]), "--text", "-q"]) == 0


def test_previous_release_plans_draw_and_edited_ones_are_refused(plans, tmp_path, capsys):
    """show re-costs a plan on its model and draws that: a file of an earlier release (fewer
    fields) draws; one whose recorded figures or strategies were edited is refused in one line."""
    old3d = json.loads(plans["3d"].read_text())
    old3d["format"] = "planner-3d/1"
    old3d.pop("tied_sync_s")
    for stage in old3d["stages"]:
        for key in list(stage):
            if key not in ("stage", "time_per_microbatch_s", "memory_bytes"):
                del stage[key]
    for op in old3d["operators"]:
        del op["layer"]
    (tmp_path / "old3d.json").write_text(json.dumps(old3d))
    assert (
        main(["show", "--plan", str(tmp_path / "old3d.json"), "--what", "schedule", "--text"]) == 0
    )
    assert (
        main(["show", "--plan", str(tmp_path / "old3d.json"), "--what", "sharding", "--text"]) == 0
    )
    capsys.readouterr()
    oldflat = json.loads(plans["zoo"].read_text())
    oldflat.pop("comm_by_kind_axis_s")
    (tmp_path / "oldflat.json").write_text(json.dumps(oldflat))
    out = tmp_path / "old.png"
    assert (
        main(
            [
                "show",
                "--plan",
                str(tmp_path / "oldflat.json"),
                "--what",
                "schedule",
                "--png",
                str(out),
            ]
        )
        == 0
    )
    assert _png_size(out.read_bytes())[0] == draw.WIDTH_IN * draw.DPI
    edited = json.loads(plans["3d"].read_text())
    edited["stages"][1]["time_per_microbatch_s"] *= 0.5
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    assert main(["show", "--plan", str(tmp_path / "edited.json"), "--text"]) == 2
    err = capsys.readouterr().err.strip()
    assert "stages[1].time_per_microbatch_s" in err and len(err.splitlines()) == 1


def test_compare_png_draws_the_csv_rows(tmp_path):
    png, csv = tmp_path / "c.png", tmp_path / "c.csv"
    assert (
        main(
            [
                "compare",
                "--model",
                "gpt2-small",
                "--mesh",
                "2x4",
                "--methods",
                "exact,dp,megatron",
                "--png",
                str(png),
                "--csv",
                str(csv),
                "-q",
            ]
        )
        == 0
    )
    assert _png_size(png.read_bytes()) == (round(draw.WIDTH_IN * draw.DPI), 450)
    import pandas as pd

    rows = pd.read_csv(csv).to_dict("records")
    fig = draw.compare_figure(rows)
    steps = {}
    for p in _patches(fig, "step:"):
        steps[round(p.get_x() + p.get_width() / 2)] = (
            steps.get(round(p.get_x() + p.get_width() / 2), 0) + p.get_height()
        )
    assert [steps[i] / 1e3 for i in range(3)] == pytest.approx(
        list(pd.read_csv(csv)["estimated_step_time_s"]), rel=1e-3
    )


def test_imported_graph_plan_is_drawn(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    graph = tmp_path / "g.json"
    assert main(["import-torch", "hf:gpt2:layers=2,seq=64", "--json", str(graph), "-q"]) == 0
    plan = _plan(tmp_path, "p.json", "--model", str(graph), "--mesh", "2x2")
    out = tmp_path / "g.png"
    assert main(["show", "--plan", str(plan), "--png", str(out), "-q"]) == 0
    view = load_view(str(plan))
    assert _png_size(out.read_bytes()) == _expected_size(view, draw.WHAT)
    fig = draw.plan_figure(view)
    step = sum(p.get_width() for p in _patches(fig, "step:")) / 1e3
    assert step == pytest.approx(view.step_time_s, rel=1e-3)
