"""Check the committed results against the code: ``python -m experiments check``.

Each experiment but train_check (whose runs the default tests train) and the benchmarks of the
whole-graph program and of the regression cases are re-run on a small slice of their full
configuration (``SLICES``), and every re-computed row is compared with the committed row of the
same configuration in results/:

    deterministic figures (status, objective, iteration time)   equal (integers exactly; floats
                                                                1e-9 relative)
    fidelity errors (rel_error)                                 within 0.1 point
    search times                                                printed as new / committed (machines
                                                                differ: never a failure)

Rows whose outcome depends on a time limit (FEASIBLE, UNKNOWN, or a whole-graph program that did
not finish) are skipped on either side. A committed row that the slice does not reproduce, or a
slice row missing from results/, fails the check: a number cannot go stale alone.

    python -m experiments check [--only scaling,fidelity] [--results results]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

import pandas as pd

from experiments.common import run

ROOT = Path(__file__).resolve().parents[1]
UNSETTLED = {"FEASIBLE", "UNKNOWN"}  # outcomes that depend on a time limit


@dataclass(frozen=True, slots=True)
class Slice:
    """A small configuration of one script whose rows the full run also wrote."""

    csv: str
    argv: tuple[str, ...]
    keys: tuple[str, ...]  # what identifies a row across the two runs
    exact: tuple[str, ...]  # compared to 1e-9 relative
    close: tuple[tuple[str, float], ...] = ()  # (column, absolute tolerance)
    script: str = ""  # a benchmark file (run as a process) instead of an experiments module


SLICES = {
    "scaling": Slice(
        "scaling.csv",
        ("--layers", "12", "--meshes", "8"),
        ("layers", "mesh", "memory", "method"),
        ("status", "objective", "whole_objective"),
    ),
    "exact_vs_heuristic": Slice(
        "exact_vs_heuristic.csv",
        ("--models", "gpt2-small", "--meshes", "8"),
        ("model", "mesh", "method"),
        ("status", "objective", "memory_per_device_bytes"),
    ),
    "fidelity": Slice(
        "fidelity.csv",
        (),
        ("source", "config", "variant"),
        ("status", "predicted_s"),
        (("rel_error", 0.001), ("value", 0.001)),
    ),
    "memory_fidelity": Slice(
        "memory_fidelity.csv",
        (),
        ("source", "config"),
        ("status", "fits", "predicted_gib", "activations_gib", "model_state_gib"),
    ),
    "smsg_models": Slice(
        "smsg_models.csv",
        ("--devices", "8"),
        ("model", "devices", "method"),
        ("status", "objective"),
    ),
    "symbolic": Slice(
        "symbolic.csv",
        ("--models", "gpt2-small,bert-large", "--meshes", "8,2x4"),
        ("model", "mesh"),
        ("agree", "datasheet_objective", "symbolic_on_datasheet_objective"),
    ),
    "sapp_scaling": Slice(
        "sapp_scaling.csv",
        ("--layers", "12", "--devices", "8"),
        ("layers", "devices", "method"),
        ("status", "objective"),
    ),
    "portability": Slice(
        "portability.csv",
        ("--smallest",),
        ("model", "changed", "devices", "device", "inter_gbps", "batch"),
        ("status", "objective", "pipeline_degree", "tensor_parallel_degree"),
    ),
    "memory_bound": Slice(
        "memory_bound.csv",
        ("--models", "mlp,transformer-block,vgg16", "--meshes", "8", "--decide", "none"),
        ("model", "mesh", "decide"),
        ("status", "objective", "memory_gib"),
    ),
    "verify": Slice(
        "verify.csv",
        ("--models", "mlp", "--meshes", "2x4", "--methods", "megatron"),
        ("model", "mesh", "method", "batch"),
        ("status", "predicted_bytes"),
        (("total_rel_error", 0.001), ("max_axis_rel_error", 0.001)),
    ),
    "pipeline": Slice(
        "pipeline.csv",
        ("--instances", "5", "--big", "", "--zoo", ""),
        ("source", "instance", "method"),
        ("status", "objective", "num_microbatches"),
    ),
    "llama": Slice(
        "llama.csv",
        ("--quick", "--threed-models", "llama3-70b"),
        ("part", "model", "devices", "mesh", "method"),
        ("status", "objective", "iteration_time_s"),
    ),
    "pictures": Slice(
        "pictures.csv", (), ("case", "model", "mesh"), ("status", "objective", "memory_bytes")
    ),
    "regress": Slice(
        "bench_regress.csv",
        # 3d-175b-1024 is left out for CI time: the pictures slice re-runs a GPT-3 175B 3D search
        ("--cases", "zero3-384"),
        ("case",),
        ("status", "figure"),
        script="benchmarks/regress.py",
    ),
    "whole_graph": Slice(
        "bench_whole_graph.csv",
        ("--meshes", "8", "--time-limit", "60"),
        ("model", "mesh", "method"),
        ("status", "objective"),
        script="benchmarks/whole_graph.py",
    ),
}


def rerun(name: str, piece: Slice, out: Path) -> None:
    if piece.script:
        subprocess.run(
            [sys.executable, piece.script, *piece.argv, "--out", str(out)],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        return
    code = import_module(f"experiments.{name}").main([*piece.argv, "--out", str(out), "--no-plot"])
    if code:
        raise SystemExit(f"experiments check: {name} exited {code}")


def compare(name: str, piece: Slice, fresh: pd.DataFrame, committed: pd.DataFrame) -> list[str]:
    """The disagreements between the re-run rows and the committed ones (empty: they agree)."""
    keys = [k for k in piece.keys if k in fresh.columns and k in committed.columns]
    index = {_key(r, keys): r for r in committed.to_dict("records")}
    problems = []
    for row in fresh.to_dict("records"):
        key = _key(row, keys)
        old = index.get(key)
        if old is None:
            problems.append(f"{name}: {dict(zip(keys, key))} is not in results/{piece.csv}")
            continue
        if {str(row.get("status")), str(old.get("status"))} & UNSETTLED:
            continue
        for column in piece.exact:
            if column in row and not _same(row[column], old.get(column), 1e-9):
                if (
                    column.startswith("whole_")
                    and {str(row.get("whole_status")), str(old.get("whole_status"))} & UNSETTLED
                ):
                    continue
                problems.append(
                    f"{name}: {dict(zip(keys, key))}: {column} {old.get(column)!r} committed, "
                    f"{row[column]!r} now"
                )
        for column, tolerance in piece.close:
            if column in row and not _close(row[column], old.get(column), tolerance):
                problems.append(
                    f"{name}: {dict(zip(keys, key))}: {column} {old.get(column)!r} committed, "
                    f"{row[column]!r} now (tolerance {tolerance})"
                )
    return problems


def _key(row: dict, keys: list[str]) -> tuple:
    return tuple(str(row.get(k)) for k in keys)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _same(a, b, rel: float) -> bool:
    if _missing(a) or _missing(b):
        return _missing(a) and _missing(b)
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)
    if x.is_integer() and y.is_integer():  # integer objectives: exactly
        return x == y
    return x == y or abs(x - y) <= rel * max(abs(x), abs(y))


def _close(a, b, tolerance: float) -> bool:
    if _missing(a) or _missing(b):
        return _missing(a) and _missing(b)
    try:
        return abs(float(a) - float(b)) <= tolerance
    except (TypeError, ValueError):  # a label (the predicted best configuration): equal or not
        return str(a) == str(b)


def times(fresh: pd.DataFrame, committed: pd.DataFrame, keys: list[str]) -> str:
    """Median ratio of the re-run's search times to the committed ones (for the eye, not a test)."""
    if "search_time_s" not in fresh.columns or "search_time_s" not in committed.columns:
        return ""
    as_text = lambda frame: frame.assign(**{k: frame[k].astype(str) for k in keys})  # noqa: E731
    joined = as_text(fresh).merge(as_text(committed), on=keys, suffixes=("", "_committed"))
    ratio = (
        (joined["search_time_s"] / joined["search_time_s_committed"])
        .replace([math.inf], math.nan)
        .dropna()
    )
    return (
        f"; search time x{ratio.median():.2f} of the committed (median of {len(ratio)})"
        if len(ratio)
        else ""
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", default=",".join(SLICES), help="which slices (default: all)")
    parser.add_argument(
        "--results", default=str(ROOT / "results"), help="the committed results folder"
    )
    args = parser.parse_args(argv)
    problems = []
    for name in args.only.split(","):
        if name not in SLICES:
            raise SystemExit(f"--only: unknown slice {name!r} (known: {', '.join(SLICES)})")
        piece = SLICES[name]
        committed = pd.read_csv(Path(args.results) / piece.csv)
        with tempfile.TemporaryDirectory() as tmp:
            rerun(name, piece, Path(tmp) / piece.csv)
            fresh = pd.read_csv(Path(tmp) / piece.csv)
        found = compare(name, piece, fresh, committed)
        keys = [k for k in piece.keys if k in fresh.columns and k in committed.columns]
        print(
            f"{name}: {len(fresh)} rows re-run, {len(found)} "
            f"disagreement(s){times(fresh, committed, keys)}",
            flush=True,
        )
        problems += found
    for line in problems:
        print(line)
    print(
        "experiments check: "
        + ("passed" if not problems else f"FAILED ({len(problems)} disagreements)")
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(run(main))
