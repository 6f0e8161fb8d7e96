"""The invariants of Hardening 3: what every command promises, one function each.

Each function takes what a generated case produced (exit code, output, the files written) and
raises ``AssertionError`` naming the broken promise. ``tests/test_fuzz.py`` checks them on
generated graphs, meshes, profiles, option combinations and edited plans; each one is also run
against a deliberately broken build there (a mutant), which it must catch.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

from planner import api
from planner.cli.main import main
from planner.search.brute import brute_force

BRUTE_LIMIT = 20_000  # strategy combinations enumerated by invariant 2
TIME_WORDS = ("time limit",)
SUB_SEARCHES = ("segment", "Pareto", "condition", "whole-graph", "relaxation", "sub-search")


def cli(*argv: str) -> tuple[int, str, str]:
    """The command line in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse refusals
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def refusal_is_one_line(code: int, err: str) -> None:
    """Invariant 0: bad input exits 2 with one line on stderr that names what was wrong (an option
    or a field), and never a traceback."""
    assert "Traceback" not in err, err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1, f"a refusal of {len(lines)} lines: {err!r}"
        assert "--" in lines[0] or "field" in lines[0] or "argument" in lines[0], lines[0]


def recost_agrees(plan_path: Path, work: Path) -> None:
    """Invariant 1: a plan the tool writes re-costs to the same objective, time and memory through
    ``planner evaluate --plan`` (flat and 3D) and, for a flat plan, through the Python API."""
    written = json.loads(plan_path.read_text())
    again = work / "again.json"
    code, _, err = cli("evaluate", "--plan", plan_path, "--json", again, "--no-timings", "-q")
    assert code in (0, 3), f"evaluate --plan exited {code}: {err}"
    fresh = json.loads(again.read_text())
    keys = (
        ("iteration_time_s", "max_memory_bytes")
        if "pipeline" in written
        else ("objective", "estimated_step_time_s", "memory_per_device_bytes", "fits_memory")
    )
    for key in keys:
        assert fresh[key] == written[key], f"{key}: written {written[key]}, re-costed {fresh[key]}"
    if "pipeline" in written:
        return
    source, settings = written["source"], written["settings"]
    plan = api.evaluate(
        source["model"],
        written["mesh"],
        source.get("device", written["device"]),
        assignment={o["name"]: o["strategy"] for o in written["operators"]},
        batch=source.get("batch"),
        seq=source.get("seq"),
        memory=written["memory_limit_bytes"] or math.inf,
        settings=_settings(settings),
        hardware_csv=source.get("hardware"),
    )
    assert plan.objective == written["objective"], (
        f"API re-costs {plan.objective}, written {written['objective']}"
    )


def _settings(recorded: dict):
    from planner.cost.settings import TrainingSettings

    return TrainingSettings.from_dict(recorded)


def status_is_earned(
    written: dict, problem, memory_limit: float | None, heuristics: dict[str, dict]
) -> None:
    """Invariant 2: OPTIMAL equals brute force where the strategies can be enumerated, and is never
    worse than a heuristic method's plan that fits; FEASIBLE carries a bound no greater than its
    objective, and its printed gap is (objective - bound) / bound."""
    status, objective, bound = written["status"], written["objective"], written["bound"]
    if status == "OPTIMAL":
        assert bound == objective, f"OPTIMAL with bound {bound} != objective {objective}"
        combos = math.prod(len(t.strategies) for t in problem.ops)
        if (
            combos <= BRUTE_LIMIT
            and not problem.settings.layer_zero
            and not problem.settings.layer_recompute
        ):
            # the JSON field is null for no limit; the search takes inf
            best = brute_force(problem, math.inf if memory_limit is None else memory_limit)
            assert best is not None and best[0] == objective, (
                f"OPTIMAL {objective}, brute force {best}"
            )
        for method, other in heuristics.items():
            if other.get("fits_memory") and other.get("objective") is not None:
                assert objective <= other["objective"], (
                    f"OPTIMAL {objective} worse than {method} {other['objective']}"
                )
    if status == "FEASIBLE":
        assert bound is not None and 0 <= bound <= objective, (
            f"FEASIBLE bound {bound}, objective {objective}"
        )
        gap = 100.0 * (objective - bound) / max(1, bound)
        assert written["gap_percent"] is not None and math.isclose(
            written["gap_percent"], gap, rel_tol=1e-9, abs_tol=1e-9
        )


def fits_are_true(code: int, written: dict | None, plan_path: Path) -> None:
    """Invariant 3: a plan that says it fits is within its memory limit; an INFEASIBLE (or UNKNOWN)
    result writes no plan file and no numbers (exit 3)."""
    if code == 3:
        assert not plan_path.exists(), "a failed search wrote a plan file"
        return
    if written is None or "pipeline" in written:
        return
    limit = written["memory_limit_bytes"]
    if written["fits_memory"]:
        assert limit is None or written["memory_per_device_bytes"] <= limit, (
            f"says it fits: {written['memory_per_device_bytes']} > {limit}"
        )
    if written["status"] in ("INFEASIBLE", "UNKNOWN"):
        assert written["objective"] is None and written["memory_per_device_bytes"] is None


def notes_agree_with_status(written: dict) -> None:
    """Invariant 5: an OPTIMAL run's notes mention a time limit only with the sub-search it stopped,
    and every bound lies in [0, objective]."""
    if written["status"] == "OPTIMAL":
        for note in written.get("notes", ()):
            if any(word in note for word in TIME_WORDS):
                assert any(part in note for part in SUB_SEARCHES), (
                    f"OPTIMAL, yet the note says {note!r}"
                )
    if written.get("bound") is not None and written.get("objective") is not None:
        assert 0 <= written["bound"] <= written["objective"], (
            f"bound {written['bound']} outside [0, objective]"
        )


# a search the wall-clock time limit cut: another run may stop elsewhere (not a promise of 6)
CUT_BY_TIME = ("FEASIBLE", "UNKNOWN")


def same_bytes(argv: list[str], plan_path: Path, first: bytes, jobs: int | None = None) -> None:
    """Invariant 6: the same input gives byte-identical ``--no-timings`` output across runs and
    across ``--jobs`` values, for a search the time limit did not cut (a CP-SAT run that stops at
    its wall-clock limit, FEASIBLE, depends on the machine's load)."""
    plan_path.unlink()
    again = argv + (["--jobs", str(jobs)] if jobs else [])
    code, _, err = cli(*again)
    assert code == 0, err
    statuses = {json.loads(first).get("status"), json.loads(plan_path.read_bytes()).get("status")}
    if statuses & set(CUT_BY_TIME):
        return
    assert plan_path.read_bytes() == first, (
        f"a second run{f' with --jobs {jobs}' if jobs else ''} wrote other bytes"
    )


def option_changes_result(
    base: dict | None, varied: dict | None, code: int, option: str, base_code: int = 0
) -> None:
    """Invariant 4: an option given at a value other than its default changes the result (a
    number, a strategy, a per-layer choice, the limit it is checked against, or whether a plan
    fits at all), or the run exits 2."""
    if code in (2, 3) or code != base_code:
        return  # refused, or no plan fits either way (exit 3 writes no plan to compare)
    assert base is not None and varied is not None, f"{option}: no plan to compare"
    assert _figures(base) != _figures(varied), f"{option} was accepted and changed nothing"


def _figures(plan: dict) -> tuple:
    if "pipeline" in plan:
        return (
            plan["iteration_time_s"],
            plan["max_memory_bytes"],
            plan["fits_memory"],
            plan["memory_limit_bytes"],
            json.dumps(plan["pipeline"], sort_keys=True),
        )
    return (
        plan["fits_memory"],
        plan["memory_limit_bytes"],
        plan["objective"],
        plan["estimated_step_time_s"],
        plan["memory_per_device_bytes"],
        json.dumps([o["strategy"] for o in plan["operators"]], sort_keys=True),
        plan["settings"]["layer_recompute"],
        plan["settings"]["layer_zero"],
    )


def consumers_check_the_plan(edited: Path, commands: tuple[str, ...] = ("show",)) -> None:
    """Invariant 7: ``show``, ``export``, ``verify``, ``run-torch`` and ``run-jax`` check a plan
    against its model before using it: an edited figure or strategy is refused with exit 2."""
    for command in commands:
        argv = [command, "--plan", edited] + (["--text"] if command == "show" else [])
        code, _, err = cli(*argv)
        refusal_is_one_line(code, err)
        assert code == 2, f"{command} used an edited plan (exit {code})"


def failed_run_keeps_files(code: int, before: dict[Path, bytes | None]) -> None:
    """Invariant 8 (hardening 4): a run that fails or is refused (exit 2 or 3) leaves every output
    file as it was (``before``: each path's bytes, None when it did not exist)."""
    if code == 0:
        return
    for path, old in before.items():
        now = path.read_bytes() if path.exists() else None
        assert now == old, f"exit {code}, yet {path.name} was written"


def infeasible_says_why(code: int, err: str) -> None:
    """Invariant 9: exit 3 (nothing fits) says why in one line on stderr; the only exits are 0, 2
    and 3."""
    assert code in (0, 2, 3), f"exit {code}: {err[-300:]}"
    if code == 3:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and "infeasible" in lines[0], f"exit 3 saying {err!r}"


def ranked_plans_recost(path: Path, model: str, batch: int) -> None:
    """Invariant 10: every plan of a top-k file or point of a Pareto file re-costs through the API
    to its own objective; top-k objectives do not decrease; no Pareto point dominates another."""
    data = json.loads(path.read_text())
    plans = data.get("plans") or data.get("points") or []
    assert plans, "a successful ranking with no plan"
    for plan in plans:
        again = api.evaluate(
            model,
            plan["mesh"],
            plan["device"],
            assignment={o["name"]: o["strategy"] for o in plan["operators"]},
            batch=batch,
            memory=plan["memory_limit_bytes"] or math.inf,
            settings=_settings(plan["settings"]),
        )
        assert again.objective == plan["objective"], (
            f"rank/point written {plan['objective']}, re-costed {again.objective}"
        )
    if "plans" in data:
        objectives = [p["objective"] for p in plans]
        assert objectives == sorted(objectives), f"top-k out of order: {objectives}"
        return
    figures = [(p["estimated_step_time_s"], p["memory_per_device_bytes"]) for p in plans]
    for a in figures:
        for b in figures:
            assert not (b != a and b[0] <= a[0] and b[1] <= a[1]), f"{b} dominates {a}"


def entries_recost_by_evaluate(path: Path, work: Path) -> None:
    """Invariant 11: every top-k plan and Pareto point, saved alone as a file, re-costs through
    ``planner evaluate --plan`` (no other option) to its own objective, time and memory."""
    data = json.loads(path.read_text())
    for n, entry in enumerate(data.get("plans") or data.get("points") or []):
        alone, again = work / f"entry{n}.json", work / f"entry{n}.again.json"
        alone.write_text(json.dumps(entry))
        code, _, err = cli("evaluate", "--plan", alone, "--json", again, "--no-timings", "-q")
        assert code in (0, 3), f"entry {n}: evaluate --plan exited {code}: {err.strip()}"
        fresh = json.loads(again.read_text())
        for key in ("objective", "estimated_step_time_s", "memory_per_device_bytes"):
            assert fresh[key] == entry[key], f"entry {n} {key}: {entry[key]} -> {fresh[key]}"


def python_error_names_parameter(call, parameters: tuple[str, ...]):
    """Invariant 12: a Python API call returns, or raises a ``PlannerError`` whose message starts
    with one of the call's own parameters (``cuts: ...``, ``settings.zero: ...``) and names no
    command-line flag. Returns the call's result (None when it raised)."""
    from planner.errors import PlannerError

    try:
        return call()
    except PlannerError as error:
        message = str(error)
        head = message.split(":", 1)[0].split(".", 1)[0]
        assert head in parameters, f"names {head!r}, not one of {parameters}: {message}"
        assert "--" not in message, f"a Python caller's error names a flag: {message}"
        return None
    except Exception as error:  # noqa: BLE001 - any other type is the broken promise
        raise AssertionError(f"{type(error).__name__} instead of a PlannerError: {error}") from None


def refusal_names_given_input(code: int, err: str, given: str) -> None:
    """Invariant 13: a refusal (exit 2) names an input the user gave: the first two options it
    names (the command line's, then the file's: ``--from-megatron: --use-flash-attn ...``) are
    on the command line or in a file the user passed (``given``: both as text); what comes after
    them is advice."""
    if code != 2:
        return
    words = err.replace(",", " ").replace(":", " ").replace("'", " ").split()
    for word in [w for w in words if w.startswith("--")][:2]:
        flag = word.split("=", 1)[0].split("/", 1)[0]
        assert flag in given.split() or f"{flag}=" in given, f"names {flag}, not given: {err}"


def launch_round_trips(plan_path: Path, work: Path) -> None:
    """Invariant 14: ``planner export --target megatron`` of a 3D plan made for Megatron-LM
    (``plan --for megatron``, ``evaluate --from-megatron``) writes a launch line that ``evaluate
    --from-megatron`` costs to the plan's own iteration time and memory; a refused export says so
    in one line and leaves its ``--out`` file as it was (and is a broken promise here)."""
    written = json.loads(plan_path.read_text())
    line, again = work / "launch.sh", work / "launch.json"
    line.write_text("kept\n")
    code, _, err = cli("export", "--plan", plan_path, "--target", "megatron", "--out", line, "-q")
    refusal_is_one_line(code, err)
    assert code in (0, 2), f"export exited {code}: {err}"
    if code == 2:
        assert line.read_text() == "kept\n", "a refused export wrote its --out file"
        # the plans this is given are made for or read from Megatron-LM: each one exports
        raise AssertionError(f"refused an export of a Megatron-LM plan: {err.strip()}")
    device = (written.get("source") or {}).get("device") or written["device"]
    code, _, err = cli(
        "evaluate", "--from-megatron", line, "--device", device, "--memory", "none",
        "--json", again, "--no-timings", "-q",
    )  # fmt: skip
    assert code == 0, f"the exported line is refused (exit {code}): {err.strip()}"
    fresh = json.loads(again.read_text())
    for key in ("iteration_time_s", "max_memory_bytes"):
        assert math.isclose(fresh[key], written[key], rel_tol=1e-9), (
            f"{key}: plan {written[key]}, its exported line {fresh[key]}"
        )
