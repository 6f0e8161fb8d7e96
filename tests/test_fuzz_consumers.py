"""Hardening 3, the consumers of a plan: option pairs and triples of ``verify``, ``run-torch``,
``run-jax``, ``export`` and ``show`` (valid and invalid values drawn together), on a real plan or
on one edited by a small change.

For each generated case the command exits 2 with one line naming the option or field (always
when the plan was edited: invariant 7, the plan is checked against its model before anything
runs), or it succeeds and what it printed keeps its promise: a training run's largest loss
difference is within the tolerance it was given, a verification ends with every row "ok", an
export writes the file it was asked for, a picture is written in its format. Runs that launch
processes are rare by construction (most draws hold one invalid value), so the default budget
stays small; ``.ci/run`` multiplies it by ``--fuzz-scale``.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzz_invariants as inv
from test_fuzz import EDITS, fuzzed

MODEL = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64"
# option -> (valid values, invalid values); None: a flag without a value
RUN = {
    "--steps": (("1", "2"), ("0", "x", "1e3")),
    "--lr": (("1e-3",), ("2", "nan", "0")),
    "--seed": (("0", "7"), ("-1", "2147483648")),
    "--tolerance": (("1e-3", "0.5"), ("-1", "nan", "inf")),
    "--max-memory": (("64GB",), ("1", "-5", "zz")),
    "--batch": (("4",), ("3", "0")),
    "--model": ((MODEL,), ("gpt2-small",)),
}
OPTIONS = {
    "verify": {
        "--tolerance": (("0.05", "0.5"), ("-1", "nan", "1e400")),
        "--no-xla": ((None,), ()),
        "--no-numpy": ((None,), ()),
        "--max-memory": (("64GB",), ("1", "-5")),
        "--devices": (("2",), ("3", "0")),
        "--batch": (("4",), ("3", "0")),
        "--seq": (("8",), ("7", "-8")),
    },
    "run-torch": {**RUN, "--nproc": (("2",), ("3", "0"))},
    "run-jax": {**RUN, "--devices": (("2",), ("3", "0"))},
    "export": {
        "--target": (("json", "torch", "jax"), ("onnx",)),
        "--tensor-axis": (("gpu",), ("zz", "node")),
        "--module": (("hf:gpt2:layers=2,hidden=32,heads=2,seq=8,vocab=64",), ("hf:gpt2:layers=2",)),
        "--out": (("x.py",), ("",)),
    },
    "show": {
        "--what": (("schedule", "memory", "sharding", "all"), ("zz",)),
        "--png": (("a.png",), ("a.jpg",)),
        "--svg": (("a.svg",), ("a.png",)),
        "--text": ((None,), ()),
    },
}


@st.composite
def consumer_cases(draw):
    """A consumer command, 2 or 3 of its options each with a valid or an invalid value, and
    (one case in three) an edit of the plan."""
    command = draw(st.sampled_from(sorted(OPTIONS)))
    table = OPTIONS[command]
    options = draw(st.lists(st.sampled_from(sorted(table)), min_size=2, max_size=3, unique=True))
    argv, invalid = [command], False
    for option in options:
        valid, bad = table[option]
        pick_bad = bool(bad) and draw(st.booleans())
        value = draw(st.sampled_from(bad if pick_bad else valid))
        invalid |= pick_bad
        argv += [option] if value is None else [option, value]
    edit = draw(st.sampled_from(sorted(EDITS))) if draw(st.integers(0, 2)) == 0 else None
    return argv, invalid, edit


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("consumers") / "p.json"
    code, _, err = inv.cli(
        "plan",
        "--model",
        MODEL,
        "--batch",
        "4",
        "--mesh",
        "2",
        "--json",
        path,
        "--no-timings",
        "-q",
    )
    assert code == 0, err
    return path


def test_consumer_options_in_combination_keep_their_promises(request, plan_file):
    """Invariants 0, 4 and 7 on about 12 consumer cases (x --fuzz-scale)."""

    @fuzzed(request, 12)
    @given(consumer_cases())
    def check(case):
        argv, invalid, edit = case
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            plan = work / "p.json"
            data = json.loads(plan_file.read_text())
            if edit is not None:
                EDITS[edit](data)
            plan.write_text(json.dumps(data))
            argv = [str(work / a) if a in ("x.py", "a.png", "a.svg", "a.jpg") else a for a in argv]
            code, out, err = inv.cli(*argv, "--plan", plan)
            inv.refusal_is_one_line(code, err)
            if edit is not None or invalid:
                assert code == 2, f"{argv} on a plan edited by {edit!r}: exit {code}, {err[-300:]}"
                return
            _kept_promise(argv, code, out, err)

    check()


def _kept_promise(argv: list[str], code: int, out: str, err: str) -> None:
    """A valid combination: refused in one line (a pair that cannot go together), or done as
    promised."""
    if code == 2:
        return
    command = argv[0]
    assert code == 0, f"{argv}: exit {code}, {err[-300:]}"
    if command in ("run-torch", "run-jax"):
        tolerance = float(argv[argv.index("--tolerance") + 1]) if "--tolerance" in argv else 1e-4
        worst = float(re.search(r"max relative difference (\S+)", out).group(1))
        assert worst <= tolerance, f"{argv}: passed with {worst} > {tolerance}"
    elif command == "verify":
        rows = [line for line in out.splitlines() if "%" in line and "total" in line]
        assert rows and all(line.rstrip().endswith("ok") for line in rows), out
    elif command == "show":
        for option, magic in (("--png", b"\x89PNG"), ("--svg", b"<")):
            if option in argv:
                picture = Path(argv[argv.index(option) + 1])
                assert picture.read_bytes().lstrip()[:4].startswith(magic), (
                    f"{argv}: {picture} is no {option[2:]}"
                )
    elif argv[argv.index("--target") + 1 :][:1] != ["json"] and "--target" in argv:
        assert Path(argv[argv.index("--out") + 1]).stat().st_size > 0, f"{argv}: nothing written"
