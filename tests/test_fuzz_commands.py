"""Hardening 4: the invariants of ``tests/fuzz_invariants.py`` on the commands added since
hardening 3 (``plan --top-k``, ``pareto``, ``plan --method megatron-grid``, ``plan --for``,
``evaluate`` with degrees), and each new invariant against a deliberately broken build.

Each generated case (a small GPT, a mesh of 2-4 devices, a memory limit that fits or not, files
that exist before the run) either exits 2 with one line, exits 3 with one line saying why and
leaves the files as they were (invariants 8, 9), or succeeds with plans that re-cost to their own
figures (invariants 1, 3, 10). About 40 cases by default (x --fuzz-scale); top-k on 1-D meshes
only (its no-good cuts wade through a 2-D mesh's symmetric ties: 8-14 s a case).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzz_invariants as inv
from test_fuzz import fuzzed

COMMANDS = ("top-k", "pareto", "megatron-grid", "for", "evaluate")


@st.composite
def cases(draw) -> tuple[str, str, int, list[str]]:
    """(command, model, batch, argv without outputs)."""
    layers, hidden = draw(st.sampled_from((1, 2))), draw(st.sampled_from((16, 32)))
    model = f"gpt:layers={layers},hidden={hidden},heads=2,seq=8,vocab=64"
    batch = draw(st.sampled_from((4, 8)))
    mesh = draw(st.sampled_from(("2", "4", "2x2", "node=2,gpu=2")))
    memory = draw(st.sampled_from(([], ["--memory", "2000"], ["--memory", "64GB"])))
    command = draw(st.sampled_from(COMMANDS))
    if command == "top-k":
        # no-good cuts on a 2-D mesh wade through its symmetric ties: 8-14 s a case
        mesh = draw(st.sampled_from(("2", "4")))
    base = ["--model", model, "--batch", str(batch), *memory]
    if command == "evaluate":
        dp = 2 if mesh == "2" else 4
        tp, dp = draw(st.sampled_from(((1, dp), (2, dp // 2))))
        argv = ["evaluate", *base, "--tp", str(tp), "--dp", str(dp), "--micro-batch", str(dp)]
    else:
        argv = ["plan" if command != "pareto" else "pareto", *base, "--mesh", mesh]
        argv += {
            "top-k": ["--top-k", str(draw(st.sampled_from((1, 2, 3))))],
            "pareto": ["--max-points", "3"],
            "megatron-grid": ["--method", "megatron-grid"],
            "for": ["--for", "megatron", "--pp", "1"],
        }.get(command, [])
    return command, model, batch, argv


def _run(argv: list[str], work: Path) -> tuple[int, str, dict, Path]:
    out, table = work / "out.json", work / "out.csv"
    out.write_text('{"kept": true}\n')
    table.write_text("kept\n")
    before = {out: out.read_bytes(), table: table.read_bytes()}
    code, _, err = inv.cli(*argv, "--json", out, "--csv", table, "--no-timings", "-q")
    return code, err, before, out


@pytest.mark.parametrize("seed", [0])
def test_the_new_commands_keep_their_promises(seed, request):
    @fuzzed(request, 40)
    @given(cases())
    def check(case):
        command, model, batch, argv = case
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            code, err, before, out = _run(argv, work)
            inv.refusal_is_one_line(code, err)
            inv.infeasible_says_why(code, err)
            inv.failed_run_keeps_files(code, before)
            if code != 0:
                return
            if command in ("top-k", "pareto"):
                inv.ranked_plans_recost(out, model, batch)
            else:
                inv.recost_agrees(out, work)
                inv.fits_are_true(code, json.loads(out.read_text()), out)

    check()


TINY = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64"


def test_a_ranking_that_writes_on_failure_is_caught(tmp_path, monkeypatch):
    """Mutant: `plan --top-k` writes its (empty) JSON before it says nothing fits."""
    import planner.cli.front as front

    real = front.infeasible

    def writes_first(why, args):
        Path(args.json).write_text('{"plans": []}')
        return real(why, args)

    monkeypatch.setattr(front, "infeasible", writes_first)
    argv = ["plan", "--model", TINY, "--mesh", "2", "--batch", "4", "--memory", "2000"]
    code, err, before, _ = _run(argv + ["--top-k", "2"], tmp_path)
    assert code == 3
    with pytest.raises(AssertionError, match="was written"):
        inv.failed_run_keeps_files(code, before)


def test_a_silent_infeasible_exit_is_caught(tmp_path, monkeypatch):
    """Mutant: `pareto` exits 3 without a word when nothing fits."""
    import planner.cli.front as front

    monkeypatch.setattr(front, "infeasible", lambda why, args: 3)
    argv = ["pareto", "--model", TINY, "--mesh", "2", "--batch", "4", "--memory", "2000"]
    code, err, _, _ = _run(argv, tmp_path)
    with pytest.raises(AssertionError, match="exit 3 saying"):
        inv.infeasible_says_why(code, err)


@pytest.mark.parametrize("what", ["objective", "order", "dominated"])
def test_a_ranking_that_misreports_is_caught(what, tmp_path):
    """Mutants: a top-k rank written one unit cheaper than it costs, two ranks swapped, a Pareto
    point that another dominates."""
    command = ["pareto", "--max-points", "3"] if what == "dominated" else ["plan", "--top-k", "3"]
    argv = [command[0], "--model", TINY, "--mesh", "4", "--batch", "4", *command[1:]]
    code, _, _, out = _run(argv, tmp_path)
    assert code == 0
    data = json.loads(out.read_text())
    if what == "objective":
        data["plans"][0]["objective"] -= 1
    elif what == "order":
        data["plans"] = data["plans"][::-1]
    else:
        worse = dict(data["points"][0])
        worse["estimated_step_time_s"] *= 2
        data["points"].append(worse)
    out.write_text(json.dumps(data))
    with pytest.raises(AssertionError):
        inv.ranked_plans_recost(out, TINY, 4)
