"""The malformed-input corpus: every case exits 2 with one line on stderr naming the field, no
traceback.

Three families: hand-written graph JSON defects (mutations of a valid file, plus raw texts),
command-line defects, and hypothesis-generated graph JSON (random field deletions, wrong types and
bad numbers). The CLI runs in-process (``planner.cli.main``) for speed; a sample also runs as a
real process to check that nothing else leaks to stderr.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli import main
from planner.errors import GraphError
from planner.ir.graph_json import graph_to_dict, load_graph
from planner.zoo.transformers import mlp

VALID = graph_to_dict(mlp(batch=8, hidden=16))  # ln, fc1, gelu, fc2, residual, loss


def _op(data, name):
    return next(o for o in data["operators"] if o["name"] == name)


def _tensor(data, name):
    return next(t for t in data["tensors"] if t["name"] == name)


def _set(path_fn, **values):
    return lambda d: path_fn(d).update(values)


def _pop(path_fn, key):
    return lambda d: path_fn(d).pop(key)


# (id, mutation of the valid graph dict, text the one-line message must contain)
GRAPH_CASES = [
    ("unknown-kind", _set(lambda d: _op(d, "fc1"), kind="frob"), "field 'kind'"),
    ("kind-not-string", _set(lambda d: _op(d, "fc1"), kind=3), "field 'kind'"),
    ("zero-dim", lambda d: _op(d, "fc1")["sizes"].update(h=0), "sizes.h"),
    ("negative-dim", lambda d: _op(d, "fc1")["sizes"].update(f=-4), "sizes.f"),
    ("float-dim", lambda d: _op(d, "fc1")["sizes"].update(f=2.5), "sizes.f"),
    ("string-dim", lambda d: _op(d, "fc1")["sizes"].update(h="16"), "sizes.h"),
    ("bool-dim", lambda d: _op(d, "fc1")["sizes"].update(h=True), "sizes.h"),
    ("huge-dim", lambda d: _op(d, "fc1")["sizes"].update(f=2**60), "sizes.f"),
    ("missing-size", lambda d: _op(d, "fc1")["sizes"].pop("f"), "field 'sizes'"),
    ("sizes-not-object", _set(lambda d: _op(d, "fc1"), sizes=[16, 64]), "field 'sizes'"),
    ("missing-equation", _pop(lambda d: _op(d, "fc1"), "equation"), "field 'equation'"),
    ("equation-no-arrow", _set(lambda d: _op(d, "fc1"), equation="bh,hf"), "field 'equation'"),
    ("equation-bad-char", _set(lambda d: _op(d, "fc1"), equation="b1,hf->bf"), "field 'equation'"),
    (
        "equation-unbalanced",
        _set(lambda d: _op(d, "fc1"), equation="b(h,hf->bf"),
        "field 'equation'",
    ),
    ("equation-arity", _set(lambda d: _op(d, "fc1"), equation="bh->bf"), "field 'equation'"),
    ("equation-rank", _set(lambda d: _op(d, "fc1"), equation="bhx,hf->bf"), "fc1"),
    ("missing-inputs", _pop(lambda d: _op(d, "fc1"), "inputs"), "field 'inputs'"),
    ("inputs-not-list", _set(lambda d: _op(d, "fc1"), inputs="ln"), "field 'inputs'"),
    ("input-not-string", _set(lambda d: _op(d, "fc1"), inputs=["ln", 7]), "'inputs'"),
    (
        "dangling-input",
        _set(lambda d: _op(d, "fc1"), inputs=["nope", "fc1.weight"]),
        "unknown tensor 'nope'",
    ),
    ("dangling-output", _set(lambda d: _op(d, "gelu"), outputs=["ghost"]), "field"),
    ("missing-outputs", _pop(lambda d: _op(d, "gelu"), "outputs"), "field 'outputs'"),
    ("two-producers", _set(lambda d: _op(d, "gelu"), outputs=["fc1"]), "field 'outputs'"),
    ("writes-param", _set(lambda d: _op(d, "gelu"), outputs=["fc2.weight"]), "field 'outputs'"),
    (
        "cycle",
        _set(lambda d: _op(d, "ln"), inputs=["residual", "ln.weight", "ln.bias"]),
        "closes a cycle",
    ),
    ("self-loop", _set(lambda d: _op(d, "gelu"), inputs=["gelu"]), "field"),
    ("shape-mismatch-edge", lambda d: _tensor(d, "fc1")["shape"].__setitem__(1, 65), "fc1"),
    (
        "param-shape-mismatch",
        _set(lambda d: _tensor(d, "fc2.weight"), shape=[64, 17]),
        "fc2.weight",
    ),
    ("missing-shape", _pop(lambda d: _tensor(d, "x"), "shape"), "field 'shape'"),
    ("shape-not-list", _set(lambda d: _tensor(d, "x"), shape=8), "field 'shape'"),
    ("shape-negative", _set(lambda d: _tensor(d, "x"), shape=[-8, 16]), "field 'shape'"),
    ("shape-float", _set(lambda d: _tensor(d, "x"), shape=[8.0, 16]), "field 'shape'"),
    ("shape-huge", _set(lambda d: _tensor(d, "x"), shape=[2**62, 16]), "field 'shape'"),
    ("bad-role", _set(lambda d: _tensor(d, "x"), role="weights"), "field 'role'"),
    ("role-not-string", _set(lambda d: _tensor(d, "x"), role=1), "field 'role'"),
    (
        "orphan-activation",
        lambda d: d["tensors"].append({"name": "lost", "shape": [4], "role": "activation"}),
        "lost",
    ),
    ("duplicate-tensor", lambda d: d["tensors"].append(dict(d["tensors"][0])), "field 'name'"),
    ("duplicate-operator", lambda d: d["operators"].append(copy.deepcopy(_op(d, "gelu"))), "field"),
    ("tensor-no-name", _pop(lambda d: d["tensors"][0], "name"), "field 'name'"),
    ("tensor-name-int", _set(lambda d: d["tensors"][0], name=5), "field 'name'"),
    ("operator-no-name", _pop(lambda d: d["operators"][0], "name"), "field 'name'"),
    ("tensor-not-object", lambda d: d["tensors"].__setitem__(0, "x"), "must be an object"),
    ("operator-not-object", lambda d: d["operators"].__setitem__(0, 3), "must be an object"),
    ("no-operators", lambda d: d.pop("operators"), "field 'operators'"),
    ("no-tensors", lambda d: d.pop("tensors"), "field 'tensors'"),
    ("operators-not-list", lambda d: d.update(operators={}), "field 'operators'"),
    ("integer-not-bool", _set(lambda d: _tensor(d, "x"), integer="yes"), "field 'integer'"),
    ("saved-not-list", _set(lambda d: _op(d, "fc1"), saved=True), "field 'saved'"),
    ("layer-not-int", _set(lambda d: _op(d, "fc1"), layer="one"), "field 'layer'"),
    ("norm-unknown-dim", _set(lambda d: _op(d, "ln"), norm="z"), "field 'norm'"),
    (
        "unsplittable-not-string",
        _set(lambda d: _op(d, "ln"), unsplittable=["h"]),
        "field 'unsplittable'",
    ),
    ("name-not-string", lambda d: d.update(name=["mlp"]), "field 'name'"),
    # round 2: silent wrong results and graphs that planned but could not be verified
    ("saved-shorter-than-inputs", _set(lambda d: _op(d, "fc1"), saved=[True]), "field 'saved'"),
    (
        "unknown-operator-key",
        _set(lambda d: _op(d, "fc1"), sizez={"b": 8}),
        "unknown field 'sizez'",
    ),
    ("unknown-tensor-key", _set(lambda d: _tensor(d, "x"), shap=[8, 16]), "unknown field 'shap'"),
    ("unknown-top-key", lambda d: d.update(operatorz=[]), "unknown field 'operatorz'"),
    ("repeated-index", _set(lambda d: _op(d, "gelu"), equation="bb->bf"), "repeats an index"),
    ("non-ascii-index", _set(lambda d: _op(d, "gelu"), equation="bé->bé"), "field 'equation'"),
    (
        "two-outputs",
        _set(lambda d: _op(d, "gelu"), equation="bf->bf,bf", outputs=["gelu", "gelu2"]),
        "field 'outputs'",
    ),
    (
        "reduce-no-inputs",
        _set(lambda d: _op(d, "loss"), equation="->", inputs=[]),
        "field 'inputs'",
    ),
]

RAW_CASES = [
    ("empty-file", "", "not valid JSON"),
    ("truncated", json.dumps(VALID)[:200], "not valid JSON"),
    ("top-level-list", "[1, 2]", "JSON object"),
    ("nan-size", json.dumps(VALID).replace('"f": 64', '"f": NaN', 1), "non-finite"),
    ("inf-size", json.dumps(VALID).replace('"f": 64', '"f": Infinity', 1), "non-finite"),
]

CLI_CASES = [
    ("unknown-model", ["plan", "--model", "gpt2-smal"], "--model"),
    ("unknown-preset-field", ["plan", "--model", "gpt:layerz=2"], "--model"),
    ("missing-graph-file", ["plan", "--model", "/nonexistent/g.json"], "--model"),
    ("unknown-device", ["plan", "--model", "mlp", "--device", "a100"], "--device"),
    ("bad-mesh", ["plan", "--model", "mlp", "--mesh", "8y"], "--mesh"),
    ("zero-mesh", ["plan", "--model", "mlp", "--mesh", "0x8"], "--mesh"),
    ("mixed-mesh", ["plan", "--model", "mlp", "--mesh", "a=2,4"], "--mesh"),
    ("negative-memory", ["plan", "--model", "mlp", "--memory", "-5"], "--memory"),
    ("garbage-memory", ["plan", "--model", "mlp", "--memory", "lots"], "--memory"),
    ("zero-batch", ["plan", "--model", "mlp", "--batch", "0"], "--batch"),
    ("text-batch", ["plan", "--model", "mlp", "--batch", "eight"], "--batch"),
    ("bad-time-limit", ["plan", "--model", "mlp", "--time-limit", "-1"], "--time-limit"),
    ("bad-method", ["plan", "--model", "mlp", "--method", "magic"], "--method"),
    ("bad-dtype", ["plan", "--model", "mlp", "--dtype", "fp4"], "--dtype"),
    ("bad-zero", ["plan", "--model", "mlp", "--zero", "5"], "--zero"),
    ("missing-model", ["plan"], "--model"),
    ("unknown-command", ["frobnicate"], "command"),
    (
        "mesh-devices-mismatch",
        ["pipeline", "--model", "gpt2-small", "--mesh", "2x8", "--devices", "8"],
        "--mesh",
    ),
    ("devices-not-multiple", ["pipeline", "--model", "gpt2-small", "--devices", "12"], "--devices"),
    (
        "compare-unknown-method",
        ["compare", "--model", "mlp", "--methods", "exact,magic"],
        "--methods",
    ),
    ("evaluate-no-plan", ["evaluate", "--model", "mlp"], "--plan"),
    (
        "evaluate-missing-plan-file",
        ["evaluate", "--model", "mlp", "--plan", "/nonexistent.json"],
        "--plan",
    ),
    ("evaluate-tp-zero", ["evaluate", "--model", "mlp", "--tp", "0"], "--tp"),
    (
        "evaluate-batch-indivisible",
        ["evaluate", "--model", "gpt2-small", "--dp", "8", "--batch", "4"],
        "--batch",
    ),
    (
        "bad-profile-json",
        ["plan", "--model", "mlp", "--device", "/nonexistent/profile.json"],
        "profile",
    ),
    # round 2
    ("unicode-digit-mesh", ["plan", "--model", "mlp", "--mesh", "\u00b2"], "--mesh"),
    ("unicode-digit-model", ["plan", "--model", "gpt:layers=\u0663"], "--model"),
    ("seq-overflow", ["plan", "--model", "gpt2-small", "--seq", "1000000000"], "--seq"),
    ("seed-too-large", ["plan", "--model", "mlp", "--seed", str(2**31)], "--seed"),
    ("moe-capacity-nan", ["plan", "--model", "moe-gpt:capacity_factor=nan"], "capacity_factor"),
    ("moe-capacity-negative", ["plan", "--model", "moe-gpt:capacity_factor=-1"], "capacity_factor"),
    ("evaluate-tp-splits-nothing", ["evaluate", "--model", "gpt2-small", "--tp", "5"], "--tp"),
    ("mesh-too-many-axes", ["plan", "--model", "gpt2-small", "--mesh", "8x8x8x8x8"], "--mesh"),
    ("empty-json-path", ["plan", "--model", "mlp", "--method", "dp", "--json", ""], "--json"),
    ("json-is-directory", ["plan", "--model", "mlp", "--method", "dp", "--json", "/tmp"], "--json"),
    ("pipeline-option-without-pipeline", ["plan", "--model", "mlp", "--pp", "2"], "--pp"),
]


def _check_one_line(code: int, err: str, field: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert field in lines[0], err
    assert "Traceback" not in err


def _run_inprocess(capsys, argv) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case_id,mutate,field", GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES])
def test_malformed_graph_json(tmp_path, capsys, case_id, mutate, field):
    data = copy.deepcopy(VALID)
    mutate(data)
    path = tmp_path / f"{case_id}.json"
    path.write_text(json.dumps(data))
    code, err = _run_inprocess(capsys, ["plan", "--model", str(path), "--method", "dp"])
    _check_one_line(code, err, field)
    assert str(path) in err  # the file is named too


@pytest.mark.parametrize("case_id,text,field", RAW_CASES, ids=[c[0] for c in RAW_CASES])
def test_malformed_raw_file(tmp_path, capsys, case_id, text, field):
    path = tmp_path / f"{case_id}.json"
    path.write_text(text)
    code, err = _run_inprocess(capsys, ["plan", "--model", str(path)])
    _check_one_line(code, err, field)


@pytest.mark.parametrize("case_id,argv,field", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_malformed_command_line(capsys, case_id, argv, field):
    code, err = _run_inprocess(capsys, argv)
    _check_one_line(code, err, field)


def test_corpus_size():
    assert len(GRAPH_CASES) + len(RAW_CASES) + len(CLI_CASES) >= 80


def test_binary_graph_file(tmp_path, capsys):
    path = tmp_path / "g.json"
    path.write_bytes(bytes(range(256)) * 4)
    code, err = _run_inprocess(capsys, ["plan", "--model", str(path)])
    _check_one_line(code, err, "--model")


@pytest.mark.parametrize(
    "field,value", [("efficiency", 5.0), ("intra_node_latency", -1), ("peak_flops", "fast")]
)
def test_nonsense_profile_values(tmp_path, capsys, field, value):
    data = {
        "peak_flops": 1e12,
        "memory_bytes": 1e9,
        "intra_node_bandwidth": 1e10,
        "inter_node_bandwidth": 1e9,
        "gpus_per_node": 8,
        field: value,
    }
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    code, err = _run_inprocess(capsys, ["plan", "--model", "mlp", "--device", str(path)])
    _check_one_line(code, err, field)


@pytest.mark.parametrize("strategy", [["b"], None, "b"])
def test_plan_strategy_of_the_wrong_type(tmp_path, capsys, strategy):
    plan = tmp_path / "p.json"
    assert main(["plan", "--model", "mlp", "--method", "dp", "--json", str(plan), "-q"]) == 0
    data = json.loads(plan.read_text())
    data["operators"][1]["strategy"] = strategy
    plan.write_text(json.dumps(data))
    code, err = _run_inprocess(capsys, ["evaluate", "--plan", str(plan)])
    _check_one_line(code, err, "strategy")


def test_plan_of_another_model_is_refused(tmp_path, capsys):
    plan = tmp_path / "p.json"
    assert (
        main(
            [
                "plan",
                "--model",
                "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128",
                "--method",
                "dp",
                "--json",
                str(plan),
                "-q",
            ]
        )
        == 0
    )
    code, err = _run_inprocess(
        capsys,
        [
            "evaluate",
            "--plan",
            str(plan),
            "--model",
            "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128",
        ],
    )
    _check_one_line(code, err, "lacks")


@pytest.mark.parametrize("case_id", ["cycle", "nan-size", "bad-mesh"])
def test_real_process_prints_one_line(tmp_path, case_id):
    if case_id == "bad-mesh":
        argv = ["plan", "--model", "mlp", "--mesh", "8y"]
    else:
        path = tmp_path / "g.json"
        if case_id == "cycle":
            data = copy.deepcopy(VALID)
            _op(data, "ln")["inputs"] = ["residual", "ln.weight", "ln.bias"]
            path.write_text(json.dumps(data))
        else:
            path.write_text(json.dumps(VALID).replace('"f": 64', '"f": NaN', 1))
        argv = ["plan", "--model", str(path)]
    proc = subprocess.run([sys.executable, "-m", "planner", *argv], capture_output=True, text=True)
    _check_one_line(
        proc.returncode, proc.stderr, "--mesh" if case_id == "bad-mesh" else str(tmp_path)
    )
    debug = subprocess.run(
        [sys.executable, "-m", "planner", "--debug", *argv], capture_output=True, text=True
    )
    assert "Traceback" in debug.stderr  # --debug shows it


# ------------------------------------------------------------------ hypothesis-generated graph JSON

BAD_VALUES = st.sampled_from(
    [None, -1, 0, 2.5, "x", [], {}, True, 2**70, float("nan"), float("inf")]
)


@st.composite
def broken_graphs(draw):
    """A valid graph with one field of one tensor or operator deleted or replaced by a bad value."""
    data = copy.deepcopy(VALID)
    family = draw(st.sampled_from(["tensors", "operators"]))
    entry = draw(st.sampled_from(data[family]))
    keys = (
        ["name", "shape", "role"]
        if family == "tensors"
        else ["name", "kind", "equation", "inputs", "outputs", "sizes"]
    )
    key = draw(st.sampled_from(keys))
    if key != "role" and draw(st.booleans()):  # role is optional (default activation)
        del entry[key]
    elif key == "sizes":
        dim = draw(st.sampled_from(sorted(entry["sizes"])))
        entry["sizes"][dim] = draw(BAD_VALUES)
        key = f"sizes.{dim}"
    elif key == "shape" and entry["shape"] and draw(st.booleans()):
        entry["shape"] = list(entry["shape"])
        entry["shape"][0] = draw(BAD_VALUES)
    else:
        entry[key] = draw(BAD_VALUES)
        if key == "name" and isinstance(entry[key], str):
            # a fresh string is a valid name: take another entry's (a duplicate) instead
            other = draw(st.sampled_from([e for e in data[family] if e is not entry]))
            entry[key] = other["name"]
    return data, key


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(broken_graphs())
def test_generated_graph_json_is_rejected_by_field(tmp_path, case):
    data, key = case
    path = tmp_path / "gen.json"
    path.write_text(json.dumps(data))  # NaN/inf are written as NaN/Infinity literals
    with pytest.raises(GraphError) as info:
        load_graph(path)
    message = str(info.value)
    assert "\n" not in message
    # The message names the field, the file, or (for a dropped/renamed entity) what references it.
    assert (
        key.split(".")[0] in message
        or "non-finite" in message
        or "unknown tensor" in message
        or "no operator produces" in message
        or "cycle" in message
        or "field 'inputs'" in message
    ), message


def test_plan_naming_an_operator_twice_is_refused(tmp_path, capsys):
    plan = tmp_path / "p.json"
    assert main(["plan", "--model", "mlp", "--method", "dp", "--json", str(plan), "-q"]) == 0
    data = json.loads(plan.read_text())
    # the last one used to win
    data["operators"].append(dict(data["operators"][0], strategy={"gpu": None}))
    plan.write_text(json.dumps(data))
    code, err = _run_inprocess(capsys, ["evaluate", "--plan", str(plan)])
    _check_one_line(code, err, "twice")


def test_graph_dims_of_2_to_the_47_overflow_cleanly(tmp_path, capsys):
    data = copy.deepcopy(VALID)
    for op in data["operators"]:
        if "b" in op["sizes"]:
            op["sizes"]["b"] = 2**47  # 2**40 still plans (a 12 s step); 2**47 exceeds int64 sums
    for t in data["tensors"]:
        if t["name"] in ("x", "ln", "fc1", "gelu", "fc2", "residual"):
            t["shape"][0] = 2**47
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(data))
    code, err = _run_inprocess(capsys, ["plan", "--model", str(path), "--memory", "none"])
    _check_one_line(code, err, "--seq/--batch")


@pytest.mark.parametrize(
    "field,value",
    [
        ("inter_node_bandwidth", 1e-30),
        ("inter_node_latency", 1e30),
        ("intra_node_bandwidth", 1e-300),
        ("kernel_launch_s", 5.0),
        ("hbm_bandwidth", 1.0),
        # were accepted: every plan costed 0 s (no optimum to find), a 300-digit memory printed
        ("peak_flops", 1e300),
        ("memory_bytes", 1e300),
        ("intra_node_bandwidth", 1e19),
    ],
)
def test_extreme_profile_constants_are_refused_by_field(tmp_path, capsys, field, value):
    """A rate or delay no device has is refused naming the profile's field (it was reported as
    --seq/--batch out of range: a model too large)."""
    data = {
        "peak_flops": 1e12,
        "memory_bytes": 1e15,
        "intra_node_bandwidth": 1e10,
        "inter_node_bandwidth": 1e9,
        "gpus_per_node": 1,
        field: value,
    }
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    code, err = _run_inprocess(
        capsys, ["plan", "--model", "mlp", "--mesh", "2x4", "--device", str(path)]
    )
    _check_one_line(code, err, f"field '{field}'")
    assert "--seq" not in err
