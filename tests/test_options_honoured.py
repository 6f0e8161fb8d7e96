"""Options that were accepted and ignored or made an unrunnable plan."""

import subprocess
import sys

import pytest

from planner import api, api3d
from planner.errors import PlannerError, SettingsError
from planner.pipeline.schedule import parse_schedule


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=cwd
    )


@pytest.mark.parametrize(
    "schedule",
    [
        "interleaved:",
        "interleaved:x",
        "interleaved:1",
        "1f1b:",
        "gpipe:2",
        "interleaved:٣",
        "interleaved:99999999",
    ],
)
def test_malformed_schedules_are_refused(schedule):
    """`interleaved:` (no v) was read as interleaved:2."""
    with pytest.raises(SettingsError, match="--schedule"):
        parse_schedule(schedule)


def test_more_chunks_than_layers_per_stage_is_refused(tmp_path):
    """interleaved:13 on 4 stages of a 24-layer model was returned as OPTIMAL: the bubble term
    (p-1)/(v m) rewards any v, but a stage needs a layer per chunk."""
    run = _cli(
        "plan",
        "--model",
        "gpt3-1.3b",
        "--mesh",
        "node=4,gpu=2",
        "--batch",
        "32",
        "--pipeline",
        "auto",
        "--pp",
        "4",
        "--num-microbatches",
        "8",
        "--schedule",
        "interleaved:13",
        "--json",
        "p.json",
        cwd=tmp_path,
    )
    assert run.returncode == 2 and not (tmp_path / "p.json").exists()
    assert (
        run.stderr.strip().count("\n") == 0
        and "--schedule" in run.stderr
        and "52 > 24" in run.stderr
    )
    with pytest.raises(SettingsError, match="--schedule"):
        api3d.evaluate_3d(
            "gpt3-1.3b", tp=2, pp=4, dp=1, micro_batch=4, batch=32, schedule="interleaved:7"
        )
    # a v that fits is planned, and the search only tries degrees with v layers per stage
    found = api3d.plan_pipeline(
        "gpt3-1.3b", "node=8,gpu=1", batch=32, schedule="interleaved:4", intra="dp", method="even"
    )
    assert found.pipeline.stages * 4 <= 24


@pytest.mark.parametrize(
    "spec,field",
    [
        ("hf:gpt2:layerz=2", "layerz"),
        ("hf:llama:layers=2,layers=3", "layers"),
        ("hf:resnet50:depth=2", "depth"),
    ],
)
def test_unknown_or_repeated_preset_keys_are_refused(spec, field):
    """`hf:gpt2:layerz=2` imported the full 12-layer GPT-2; a repeated key, the last won."""
    pytest.importorskip("torch")
    from planner.engines.torch.presets import build_spec

    with pytest.raises(PlannerError, match=field):
        build_spec(spec)


# ---------------------------------------------------------------- silent wrong results


def _main(*argv) -> tuple[int, str, str]:
    """The CLI in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io
    from planner.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


TINY = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"


def test_zero_auto_on_bert_plans_and_recosts_to_its_objective():
    """`--zero auto` on bert-base raised "Pareto master: the plan costs ... its label ...": the
    ZeRO-3 variant's front tables were keyed by the stage-0 problem's segment hashes, so ln1 and
    ln2 (equal at stage 0, not under ZeRO-3 gathers) shared one table."""
    from planner.cost.settings import AUTO, TrainingSettings

    found = api.plan("bert-base", "8", "a100-80g", settings=TrainingSettings(zero=AUTO))
    assert found.status == "OPTIMAL" and dict(found.settings)["layer_zero"]
    assignment = {o["name"]: o["strategy"] for o in found.to_dict()["operators"]}
    again = api.evaluate(
        "bert-base",
        "8",
        "a100-80g",
        assignment=assignment,
        settings=TrainingSettings(zero=AUTO, layer_zero=found_layer_zero(found)),
    )
    assert again.objective == found.objective


def found_layer_zero(plan):
    from planner.cost.settings import parse_layer_modes

    return parse_layer_modes(dict(plan.settings)["layer_zero"], "layer_zero")


def test_auto_modes_on_a_graph_without_layers_are_refused():
    code, _, err = _main("plan", "--model", "mlp", "--mesh", "8", "--zero", "auto")
    assert code == 2 and "--zero auto" in err and "no layers" in err and err.count("\n") == 1


def test_whole_graph_fallback_honours_zero_auto(monkeypatch):
    """When the exact search falls back to the whole-graph program (no single-tensor cut, or the
    segments ran out of time), `--zero auto` was dropped: the plan was the stage-0 plan bit for bit.
    Now every uniform stage is solved and the best one is reported (FEASIBLE: a mix may be
    cheaper)."""
    from planner.cost.settings import AUTO, TrainingSettings
    from planner.search import exact

    monkeypatch.setattr(exact, "split_segments", lambda problem: ())  # as for a graph without cuts
    cluster = api.make_cluster("8", "a100-80g")
    problem = api.make_problem(
        "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128",
        cluster,
        TrainingSettings(zero=AUTO),
        batch=8,
    )
    result, notes = exact.solve_exact(problem, cluster.memory_limit, 30.0)
    assert result.status == "FEASIBLE" and [layer for layer, _ in result.layer_zero] == [0, 1]
    assert any("uniform" in note for note in notes)


@pytest.mark.parametrize(
    "key,value",
    [
        ("fp32_grads", "false"),
        ("sequence_parallel", "false"),
        ("zero", 2.7),
        ("zero", True),
        ("zero", "x"),
        ("bucket_mb", "x"),
        ("bucket_mb", -1),
        ("recompute", "some"),
        ("layer_zero", 3),
        ("typo", 1),
    ],
)
def test_plan_settings_are_checked_not_coerced(tmp_path, key, value):
    """`fp32_grads: "false"` turned fp32 gradients on, `zero: 2.7` was ZeRO-2, unknown keys
    passed."""
    import json

    path = tmp_path / "p.json"
    assert _main("plan", "--model", "mlp", "--mesh", "4", "--json", str(path), "-q")[0] == 0
    data = json.loads(path.read_text())
    data["settings"][key] = value
    path.write_text(json.dumps(data))
    code, _, err = _main("evaluate", "--plan", str(path))
    assert code == 2 and "settings" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("value", [0, -1, "80GB", True])
def test_a_plan_memory_limit_must_be_a_positive_number(tmp_path, value):
    """`memory_limit_bytes: 0` meant no limit and reported that the plan fits."""
    import json

    path = tmp_path / "p.json"
    assert _main("plan", "--model", "mlp", "--mesh", "4", "--json", str(path), "-q")[0] == 0
    data = json.loads(path.read_text())
    data["memory_limit_bytes"] = value
    path.write_text(json.dumps(data))
    code, _, err = _main("evaluate", "--plan", str(path))
    assert code == 2 and "memory_limit_bytes" in err


@pytest.mark.parametrize(
    "extra",
    [
        ("--method", "dp"),
        ("--schedule", "gpipe"),
        ("--fp32-grads",),
        ("--method", "megatron"),
        ("--dtype", "fp32", "--optimizer", "sgd"),
        (),
    ],
)
def test_every_3d_plan_recosts_to_its_iteration_time(tmp_path, extra):
    """Stage 0's gradient sync was taken at the first micro-batch count the chain was costed at,
    while the part of the sync hidden behind the last backward pass depends on the micro-batch
    size: `evaluate --plan` gave another iteration time (0.49871 vs 0.49870 s)."""
    import json

    path, again = tmp_path / "p.json", tmp_path / "q.json"
    code, _, err = _main(
        "plan",
        "--model",
        "gpt:layers=8,hidden=256,heads=4,seq=64,vocab=512",
        "--mesh",
        "node=4,gpu=2",
        "--batch",
        "32",
        "--pipeline",
        "auto",
        "--pp",
        "2",
        *extra,
        "--json",
        str(path),
        "-q",
    )
    assert code == 0, err
    assert _main("evaluate", "--plan", str(path), "--json", str(again), "-q")[0] == 0
    first, second = json.loads(path.read_text()), json.loads(again.read_text())
    assert second["iteration_time_s"] == first["iteration_time_s"]
    assert [s["grad_sync_s"] for s in second["stages"]] == [
        s["grad_sync_s"] for s in first["stages"]
    ]


def test_tp_that_splits_no_attention_says_so():
    """`evaluate --tp 8` on gpt2-small (12 heads) replicated attention with no note."""
    code, out, _ = _main("evaluate", "--model", "gpt2-small", "--tp", "8", "--dp", "1")
    assert code == 0 and "note: --tp 8:" in out and "replicated" in out
    code, out, _ = _main("evaluate", "--model", "gpt2-small", "--tp", "4", "--dp", "2")
    assert code == 0 and "note: --tp" not in out


# ---------------------------------------------------------------- plans checked against their model


@pytest.fixture(scope="module")
def plan_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plans")
    flat, three = tmp / "flat.json", tmp / "3d.json"
    assert _main("plan", "--model", "mlp", "--mesh", "2x2", "--json", str(flat), "-q")[0] == 0
    assert (
        _main(
            "plan",
            "--model",
            TINY,
            "--mesh",
            "node=2,gpu=2",
            "--batch",
            "8",
            "--pipeline",
            "auto",
            "--pp",
            "2",
            "--num-microbatches",
            "2",
            "--json",
            str(three),
            "-q",
        )[0]
        == 0
    )
    return flat, three


def _edited(path, tmp_path, edit):
    import json

    data = json.loads(path.read_text())
    edit(data)
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(data))
    return str(out)


EDITS_3D = {
    "num_microbatches": lambda d: d["pipeline"].__setitem__("num_microbatches", 3),
    "negative count": lambda d: d["pipeline"].__setitem__("num_microbatches", -4),
    "cuts": lambda d: d["pipeline"].__setitem__("cuts", [7]),
    "schedule": lambda d: d["pipeline"].__setitem__("schedule", "interleaved:100000"),
    "stage rows": lambda d: d.__setitem__("stages", d["stages"][:1]),
    "stage of an operator": lambda d: d["operators"][3].__setitem__("stage", 1),
    "iteration time": lambda d: d.__setitem__("iteration_time_s", 1.0),
    "unknown axis": lambda d: d["operators"][3]["strategy"].__setitem__("rack", "b"),
}


@pytest.mark.parametrize("edit", sorted(EDITS_3D))
@pytest.mark.parametrize("command", ["show", "evaluate", "run-torch", "run-jax"])
def test_edited_3d_plans_are_refused_by_every_command(plan_files, tmp_path, edit, command):
    """show drew whatever the JSON said; run-torch trained M = 3 on batch 8 (12 samples) and ignored
    garbage cuts and unknown axes. Every consumer now re-costs the plan on its model first and
    refuses a recorded figure that disagrees; evaluate re-costs an edited plan and reports the new
    figures (editing a plan to cost another is what it is for), but refuses what cannot run."""
    if command == "evaluate" and edit in ("iteration time", "stage rows", "stage of an operator"):
        return
    path = _edited(plan_files[1], tmp_path, EDITS_3D[edit])
    code, _, err = _main(command, "--plan", path)
    assert code == 2 and err.count("\n") == 1, err


@pytest.mark.parametrize("command", ["show", "export"])
def test_edited_flat_plans_are_refused(plan_files, tmp_path, command):
    path = _edited(plan_files[0], tmp_path, lambda d: d.__setitem__("estimated_step_time_s", 1e-9))
    code, _, err = _main(command, "--plan", path)
    assert code == 2 and "estimated_step_time_s" in err or "objective" in err
    path = _edited(plan_files[0], tmp_path, lambda d: d["operators"][1].__setitem__("strategy", {}))
    assert _main("show", "--plan", path)[0] == 2


def test_show_refuses_a_schedule_too_large_to_draw(tmp_path):
    """show simulated and drew 10^5 micro-batches without bound (and ignored SIGTERM meanwhile)."""
    path = tmp_path / "big.json"
    assert (
        _main(
            "plan",
            "--model",
            TINY,
            "--mesh",
            "node=2,gpu=1",
            "--batch",
            "32768",
            "--pipeline",
            "auto",
            "--pp",
            "2",
            "--num-microbatches",
            "32768",
            "--json",
            str(path),
            "-q",
        )[0]
        == 0
    )
    code, _, err = _main("show", "--plan", str(path), "--what", "schedule", "--text")
    assert code == 2 and "--what" in err and "blocks" in err
    assert _main("show", "--plan", str(path), "--what", "memory", "--text")[0] == 0


def test_nan_tolerance_is_refused():
    """`--tolerance nan` passed every run; a NaN loss was skipped by the printed maximum."""
    from planner.engines.jobs import TrainRun

    for command in ("run-torch", "run-jax", "verify"):
        with pytest.raises(SystemExit) as refused:
            _main(command, "--plan", "p.json", "--tolerance", "nan")
        assert refused.value.code == 2
    assert TrainRun((1.0, float("nan")), (1.0, 1.0), 2, "cpu").max_rel_diff == float("inf")


def test_export_names_an_unknown_tensor_axis(plan_files):
    code, _, err = _main("export", "--plan", str(plan_files[0]), "--tensor-axis", "rack")
    assert code == 2 and "--tensor-axis" in err and err.count("\n") == 1


def test_run_memory_is_estimated_before_any_process_starts(plan_files):
    """A valid gpt3-1.3b 3D plan was OOM-killed after 110 s: runs had no estimate, unlike verify."""
    for command, path in (
        ("run-torch", plan_files[0]),
        ("run-jax", plan_files[0]),
        ("run-torch", plan_files[1]),
    ):
        code, _, err = _main(command, "--plan", str(path), "--max-memory", "1MB")
        assert code == 2 and "--max-memory" in err and "GB" in err


@pytest.mark.slow
def test_sigterm_stops_every_rank_of_run_torch(plan_files, tmp_path):
    """SIGTERM exited 143 but left every torchrun rank running."""
    import signal
    import time

    pytest.importorskip("torch")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "planner",
            "run-torch",
            "--plan",
            str(plan_files[0]),
            "--steps",
            "300",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline and len(_ranks(proc.pid)) < 4:
        time.sleep(0.2)
    ranks = _ranks(proc.pid)
    assert len(ranks) >= 4
    time.sleep(1.0)  # the ranks at work
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    time.sleep(1.0)
    alive = [pid for pid in ranks if __import__("os").path.exists(f"/proc/{pid}")]
    assert not alive, alive


def _ranks(root: int) -> list[int]:
    """The planner.engines.torch.worker processes below process ``root`` (its torchrun's children),
    from /proc."""
    from pathlib import Path

    parent, command = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
                command[int(entry.name)] = (entry / "cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue

    def below(pid: int) -> bool:
        while pid in parent and pid > 1:
            pid = parent[pid]
            if pid == root:
                return True
        return False

    return [
        pid
        for pid in parent
        if b"planner.engines.torch.worker" in command.get(pid, b"") and below(pid)
    ]


# ---------------------------------------------------------------- input files and one-line errors


BAD_JSON = {
    "deep nesting": b"[" * 100000 + b"]" * 100000,
    "5000-digit integer": b'{"name": ' + b"9" * 5000 + b"}",
    "invalid UTF-8": b'{"name": "\xff\xfe"}',
    "lone surrogate": b'{"name": "a\\ud800b"}',
    "duplicate key": b'{"name": "a", "name": "b"}',
    "NaN": b'{"name": NaN}',
}


@pytest.mark.parametrize("case", sorted(BAD_JSON))
@pytest.mark.parametrize("option", ["--plan", "--model", "--device"])
def test_malformed_json_inputs_give_one_line(tmp_path, case, option):
    path = tmp_path / "bad.json"
    path.write_bytes(BAD_JSON[case])
    argv = {
        "--plan": ("evaluate", "--plan", str(path)),
        "--model": ("plan", "--model", str(path)),
        "--device": ("plan", "--model", "mlp", "--device", str(path)),
    }[option]
    code, _, err = _main(*argv)
    assert code == 2 and err.count("\n") == 1 and option in err, err


def test_names_with_control_characters_are_refused(tmp_path):
    import json
    from planner.ir.graph_json import graph_to_dict
    from planner.zoo import load_model

    data = graph_to_dict(load_model("mlp"))
    data["operators"][0]["name"] = "fc\n1"
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    code, _, err = _main("plan", "--model", str(path), "--mesh", "4")
    assert code == 2 and err.count("\n") == 1 and "'name'" in err


def test_long_numbers_are_cut_in_refusals():
    """A 4000-digit --batch printed all its digits (and one raised OverflowError in the costing)."""
    for option in ("--batch", "--time-limit", "--seed"):
        with pytest.raises(SystemExit) as refused:
            _main("plan", "--model", "mlp", option, "9" * 4000)
        assert refused.value.code == 2


def test_small_memory_figures_are_not_printed_as_zero_gib():
    from planner.units import bytes_text

    assert (
        bytes_text(3e6) == "2.86 MiB"
        and bytes_text(80e9) == "74.51 GiB"
        and bytes_text(512) == "0.50 KiB"
    )
    code, out, _ = _main("plan", "--model", "mlp", "--mesh", "4", "--memory", "3MB")
    assert code == 3 and "0.00 GiB" not in out and "2.86 MiB" in out


def test_infeasible_under_auto_gives_the_least_memory_of_any_mode_and_no_given_lever():
    """Under --zero/--recompute auto the bound was the stage-0 plan's (129 GiB against 88 GiB) and
    the advice suggested --zero 1/2/3."""
    code, out, _ = _main(
        "plan",
        "--model",
        "gpt2-small",
        "--mesh",
        "2",
        "--memory",
        "1GB",
        "--zero",
        "auto",
        "--recompute",
        "auto",
    )
    assert code == 3 and "--zero 1/2/3" not in out and "--recompute full" not in out
    need = float(out.split("needs at least ")[1].split()[0])
    code, plain, _ = _main("plan", "--model", "gpt2-small", "--mesh", "2", "--memory", "1GB")
    assert code == 3 and need < float(plain.split("needs at least ")[1].split()[0])


def test_outputs_refuse_loops_drop_setuid_and_check_the_picture_suffix(tmp_path):
    import os
    import stat

    loop = tmp_path / "loop"
    os.symlink(tmp_path / "loop2", loop)
    os.symlink(loop, tmp_path / "loop2")
    code, _, err = _main("plan", "--model", "mlp", "--mesh", "4", "--json", str(loop), "-q")
    assert code == 2 and "symbolic links" in err and os.path.islink(loop)
    target = tmp_path / "p.json"
    target.write_text("{}")
    os.chmod(target, 0o4755)
    assert _main("plan", "--model", "mlp", "--mesh", "4", "--json", str(target), "-q")[0] == 0
    assert not os.stat(target).st_mode & stat.S_ISUID
    code, _, err = _main("show", "--plan", str(target), "--png", str(tmp_path / "x.jpg"))
    assert code == 2 and "--png" in err and not (tmp_path / "x.jpg").exists()


def test_a_time_limit_too_short_for_any_search_gives_the_same_answer_with_exact_and_whole():
    """`--time-limit 1e-9` exited 3 (UNKNOWN) with exact and gave the FEASIBLE greedy plan with
    whole."""
    code, out, _ = _main("plan", "--model", "gpt2-small", "--mesh", "8", "--time-limit", "1e-9")
    code2, out2, _ = _main(
        "plan", "--model", "gpt2-small", "--mesh", "8", "--time-limit", "1e-9", "--method", "whole"
    )
    assert (
        code == code2 == 0
        and "FEASIBLE" in out.splitlines()[0]
        and "FEASIBLE" in out2.splitlines()[0]
    )


def test_an_interrupted_experiment_leaves_the_committed_csv_as_it_was(tmp_path):
    """Ctrl-C during `python -m experiments.scaling` rewrote the committed CSV with the rows done
    so far (24 rows became 4): rows now go to <csv>.partial until the run ends."""
    from experiments.common import ResultsTable

    path = tmp_path / "r.csv"
    path.write_text("a,b\n1,2\n3,4\n")
    table = ResultsTable(path, ("a",))
    table.add([{"a": 5, "b": 6}])
    assert path.read_text() == "a,b\n1,2\n3,4\n" and (tmp_path / "r.csv.partial").exists()
    resumed = ResultsTable(path, ("a",), resume=True)
    assert resumed.done(a=5) and not resumed.done(a=1)
    resumed.add([{"a": 7, "b": 8}])
    resumed.finish()
    assert path.read_text() == "a,b\n5,6\n7,8\n" and not (tmp_path / "r.csv.partial").exists()


IMPORT_CASES = {
    "data-dependent control flow": ("dyn", "torch.export cannot trace"),
    "a factory that raises": ("raises", "RuntimeError: boom"),
    "a forward that raises": ("fwd", "bad forward"),
    "a wrong input shape": ("shape", "torch.export cannot trace"),
}
USER_MODULES = """
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(8, 8)
    def forward(self, x):
        if x.sum() > 0:
            return self.l(x)
        return x
class R(torch.nn.Module):
    def forward(self, x):
        raise ValueError("bad forward")
def dyn():
    return M(), (torch.randn(4, 8),)
def raises():
    raise RuntimeError("boom")
def fwd():
    return R(), (torch.randn(2, 2),)
def shape():
    return torch.nn.Linear(8, 8), (torch.randn(4, 7),)
"""


@pytest.mark.parametrize("case", sorted(IMPORT_CASES) + ["a syntax error", "hf:gpt2:heads=5"])
def test_import_torch_failures_are_one_line(tmp_path, case):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    (tmp_path / "m.py").write_text(USER_MODULES)
    (tmp_path / "bad.py").write_text("def f(:\n")
    if case in IMPORT_CASES:
        spec, words = f"{tmp_path / 'm.py'}:{IMPORT_CASES[case][0]}", IMPORT_CASES[case][1]
    elif case == "a syntax error":
        spec, words = f"{tmp_path / 'bad.py'}:f", "SyntaxError"
    else:
        spec, words = "hf:gpt2:layers=1,hidden=64,heads=5", "divisible"
    code, _, err = _main("import-torch", spec, "--json", str(tmp_path / "g.json"))
    assert code == 2 and words in err and err.count("\n") == 1, err
    assert not (tmp_path / "g.json").exists()


def test_export_refuses_a_module_of_another_configuration(tmp_path):
    """`export --target torch --module` put a hidden-64 plan onto a hidden-768 module."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    graph, plan = tmp_path / "g.json", tmp_path / "p.json"
    small = "hf:gpt2:layers=1,hidden=64,heads=4,seq=16"
    assert _main("import-torch", small, "--json", str(graph), "-q")[0] == 0
    assert _main("plan", "--model", str(graph), "--mesh", "2", "--json", str(plan), "-q")[0] == 0
    other = "hf:gpt2:layers=1,hidden=128,heads=4,seq=16"
    code, _, err = _main(
        "export",
        "--plan",
        str(plan),
        "--target",
        "torch",
        "--out",
        str(tmp_path / "x.py"),
        "--module",
        other,
    )
    assert code == 2 and "--module" in err and not (tmp_path / "x.py").exists()
    assert (
        _main(
            "export",
            "--plan",
            str(plan),
            "--target",
            "torch",
            "--out",
            str(tmp_path / "x.py"),
            "--module",
            small,
            "-q",
        )[0]
        == 0
    )


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda op: op.__setitem__("saved", ["false", "false"]), "saved"),
        (lambda op: op.update(kind="opaque", unsplittable=""), None),
    ],
)
def test_graph_files_are_checked_not_coerced(tmp_path, edit, field):
    """Strings in `saved` were read as booleans; an `opaque` operator written in a graph JSON was
    split (the planner cannot see into it: it runs whole)."""
    import json
    from planner.ir.graph_json import graph_to_dict
    from planner.zoo import load_model

    data = graph_to_dict(load_model("mlp"))
    edit(data["operators"][1])  # fc1: bh,hf->bf
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    code, out, err = _main(
        "plan", "--model", str(path), "--mesh", "4", "--json", str(tmp_path / "p.json")
    )
    if field is not None:
        assert code == 2 and field in err and err.count("\n") == 1
        return
    assert code == 0, err
    plan = json.loads((tmp_path / "p.json").read_text())
    assert next(o for o in plan["operators"] if o["name"] == "fc1")["strategy"] == {"gpu": None}


@pytest.mark.slow
def test_a_tied_model_whose_segments_time_out_gives_the_rest_to_the_whole_program():
    """t5-3b with --time-limit 20 ended FEASIBLE 34% off: each tied-layout condition fell back to
    the whole-graph program with the 0.2 s left of its share. The first condition's time-out now
    hands the rest to one whole program of the tied problem (OPTIMAL, 110,279,979 ns on 2 cores)."""
    code, out, err = _main("plan", "--model", "t5-3b", "--mesh", "8", "--time-limit", "30")
    assert code == 0, err
    assert "OPTIMAL" in out.splitlines()[0] and "solved as one whole-graph program" in out


def test_a_3d_plan_that_fits_nowhere_gives_the_least_memory():
    code, _, err = _main(
        "plan",
        "--model",
        "gpt3-175b",
        "--mesh",
        "node=2,gpu=4",
        "--pipeline",
        "auto",
        "--batch",
        "8",
    )
    # the limit: 80 GB less the device's 2 GB reserve
    assert code == 3 and "per device, the limit is 72.64 GiB" in err and err.count("\n") == 1


# ---------------------------------------------------------------- defects the fuzz suite found


def test_fuzz_found_a_profile_file_that_the_plan_did_not_record(tmp_path):
    """Minimal input: `plan --device custom.json --json p.json`, then `evaluate --plan p.json`: the
    plan recorded the profile's name ("custom"), not its file, and evaluate exited 2."""
    import json

    profile = tmp_path / "custom.json"
    profile.write_text(
        json.dumps(
            {
                "name": "custom",
                "peak_flops": 1e12,
                "memory_bytes": 1e9,
                "intra_node_bandwidth": 1e9,
                "inter_node_bandwidth": 1e9,
                "gpus_per_node": 2,
            }
        )
    )
    plan = tmp_path / "p.json"
    assert (
        _main(
            "plan",
            "--model",
            "mlp",
            "--mesh",
            "4",
            "--device",
            str(profile),
            "--json",
            str(plan),
            "-q",
        )[0]
        == 0
    )
    code, out, err = _main("evaluate", "--plan", str(plan))
    assert code == 0, err
    assert json.loads(plan.read_text())["source"]["device"] == str(profile)


def test_fuzz_found_a_plan_of_a_graph_without_one_batch_size(tmp_path):
    """Minimal input: a graph whose batch dim 'b' has two sizes (x[2,4] transposed into [4,2]):
    `plan` wrote a plan that `evaluate --plan` refused ("field 'batch_dim' has different sizes"),
    since evaluate asked for the batch size, which a given plan does not need."""
    import json
    from planner.ir.graph_json import graph_to_dict
    from planner.ir.ops import GraphBuilder

    gb = GraphBuilder("two-batches")
    x = gb.data("x", (2, 4))
    t = gb.op("transpose", "t", "bk->kb", [x])
    gb.op("matmul", "mm", "bk,kn->bn", [t, gb.param("w", (2, 4))])
    graph, plan = tmp_path / "g.json", tmp_path / "p.json"
    graph.write_text(json.dumps(graph_to_dict(gb.build())))
    assert _main("plan", "--model", str(graph), "--mesh", "2", "--json", str(plan), "-q")[0] == 0
    assert _main("evaluate", "--plan", str(plan), "-q")[0] == 0


def test_fuzz_found_fp32_grads_that_change_nothing_under_fp32():
    """Minimal input: `evaluate ... --dtype fp32 --fp32-grads`: accepted, and every figure equal to
    the run without --fp32-grads (gradients are fp32 already). Refused now."""
    code, _, err = _main(
        "evaluate",
        "--model",
        TINY,
        "--batch",
        "8",
        "--tp",
        "2",
        "--dp",
        "2",
        "--dtype",
        "fp32",
        "--fp32-grads",
    )
    assert code == 2 and "--fp32-grads" in err


def test_fuzz_found_a_cuts_refusal_that_named_no_option():
    """Minimal input: `planner pipeline --model GPT --mesh node=2,gpu=2 --cuts 2 --pp 1`: exit 2
    with "cuts: [2] are not 0 increasing layer indices", naming neither --cuts nor a field."""
    code, _, err = _main(
        "pipeline",
        "--model",
        TINY,
        "--batch",
        "8",
        "--mesh",
        "node=2,gpu=2",
        "--cuts",
        "2",
        "--pp",
        "1",
    )
    assert code == 2 and err.startswith("planner: error: --cuts:") and err.count("\n") == 1


def test_beside_a_plan_in_hand_the_master_gets_the_whole_condition(monkeypatch):
    """gpt3-175b on 8x8 ended FEASIBLE beside other jobs and OPTIMAL alone: a tied condition with
    another condition's plan in hand gave the Pareto master half its time and the Lagrangian path
    the rest, which can only find a plan that cannot win. The master, the only search that can
    prove such a condition dominated, now gets all of it (at --time-limit 12 on 2 cores: FEASIBLE
    with a 19.5%-off note -> OPTIMAL)."""
    from planner.search import exact, master
    from planner.search.state import SearchState

    seen = []
    real = master._pareto

    def spy(state, limit, deadline):
        seen.append((deadline, state.incumbent))
        return real(state, limit, deadline)

    monkeypatch.setattr(master, "_pareto", spy)
    problem = _untied(api.make_problem(TINY, api.make_cluster("8", "a100-80g"), batch=8))
    limit = int(exact.min_memory(problem) * 1.05)
    start = __import__("time").perf_counter()
    exact._solve_untied(SearchState(problem, limit, 30.0, incumbent=10**12))
    assert seen and seen[-1] == (seen[-1][0], 10**12)
    assert seen[-1][0] >= start + 29.0  # the whole 30 s, not half


def test_a_cut_master_keeps_its_proven_bound_on_the_lagrangian_path():
    """A master cut after proving its Lagrangian bound handed the fallback nothing, so a run with no
    time left reported the separable bound (272% gap where 0.18% was proven)."""
    import math
    from planner.search.decompose import split_segments
    from planner.search.lagrangian import lagrangian
    from planner.search.reduce import Workers
    from planner.search.state import SearchState

    problem = _untied(api.make_problem(TINY, api.make_cluster("8", "a100-80g"), batch=8))
    segments = split_segments(problem)
    with Workers(problem, 1, 1) as workers:  # a time limit of -1 s: the deadline has passed
        state = SearchState(problem, math.inf, -1.0, segments=segments, workers=workers)
        result, _ = lagrangian(state, None, proven=123_456)
    assert result.bound >= 123_456 - 1


def _untied(problem):
    """The problem with its tied embedding pinned to one layout (a condition of the tied search)."""
    from planner.search.ties import conditioned, owner_groups

    groups = owner_groups(problem)
    return conditioned(problem, {owner: sorted(groups[owner].items())[0][0] for owner in groups})
