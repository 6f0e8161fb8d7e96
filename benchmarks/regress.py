"""Regression benchmark: the cases whose guarantees slipped once, each figure printed beside the
last committed one (results/bench_regress.csv at HEAD), so a change that moves them shows.

Cases (each one CLI command, timed as a whole process, costing and search included):
  memory-bound    gpt 96 layers (175B shapes) on 8x8 A100, default memory: exact, OPTIMAL expected
  auto-modes      the same with --recompute auto --zero auto (layer choices in the Pareto master)
  zero3-384       evaluate 175B ZeRO-3 on 384 GPUs (the bucket rule: 168 s before the fix)
  3d-175b-1024    pipeline gpt3-175b on 1024 devices, batch 1536 (csimd)
  3d-1t-3072      pipeline gpt:128 layers, hidden 25600 (1T) on 3072 devices, batch 3072
  fidelity        python -m experiments.fidelity --quick: mean / max relative error

Usage: python benchmarks/regress.py [--cases a,b] [--out results/bench_regress.csv]
Wall times are machine-dependent: compare the ratio column, measured against the committed row.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the experiments package
from experiments.common import with_provenance  # noqa: E402
from planner.outputs import write_csv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPT_175B = "gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200"
CASES = {
    "memory-bound": ["plan", "--model", GPT_175B, "--mesh", "8x8", "--device", "a100-80g"],
    "auto-modes": [
        "plan",
        "--model",
        GPT_175B,
        "--mesh",
        "8x8",
        "--device",
        "a100-80g",
        "--recompute",
        "auto",
        "--zero",
        "auto",
        "--time-limit",
        "120",
    ],
    "zero3-384": [
        "evaluate",
        "--model",
        GPT_175B,
        "--device",
        "a100-80g",
        "--batch",
        "1536",
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "384",
        "--micro-batch",
        "4",
        "--zero",
        "3",
        "--recompute",
        "full",
    ],
    "3d-175b-1024": [
        "pipeline",
        "--model",
        "gpt3-175b",
        "--devices",
        "1024",
        "--batch",
        "1536",
        "--schedule",
        "1f1b",
        "--pipeline-method",
        "csimd",
    ],
    "3d-1t-3072": [
        "pipeline",
        "--model",
        "gpt:layers=128,hidden=25600,heads=160,seq=2048,vocab=51200",
        "--devices",
        "3072",
        "--batch",
        "3072",
        "--schedule",
        "1f1b",
        "--pipeline-method",
        "csimd",
    ],
}


def run_cli(words: list[str]) -> dict:
    """One planner command as its own process; its JSON's headline figures and its wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "planner", *words, "--json", str(out), "--quiet"],
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        if not out.exists():
            return {
                "status": f"exit {done.returncode}",
                "wall_s": round(wall, 2),
                "detail": (done.stderr.strip().splitlines() or [""])[-1],
            }
        data = json.loads(out.read_text())
    if "pipeline" in data:
        pipe = data["pipeline"]
        return {
            "status": data["status"],
            "figure": data["iteration_time_s"],
            "unit": "iteration s",
            "wall_s": round(wall, 2),
            "detail": f"{pipe['stages']} stages x {pipe['stage_mesh']}, {pipe['num_microbatches']} "
            f"micro-batches of {pipe['micro_batch']}",
        }
    return {
        "status": data["status"],
        "figure": data["objective"],
        "unit": "objective ns",
        "wall_s": round(wall, 2),
        "detail": f"{(data.get('memory_per_device_bytes') or 0) / 2**30:.2f} GiB",
    }


def run_fidelity() -> list[dict]:
    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "f.csv"
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "experiments.fidelity",
                "--quick",
                "--out",
                str(out),
                "--no-plot",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        wall = time.perf_counter() - start
        frame = pd.read_csv(out)
    main = frame[frame["rel_error"].notna() & frame["source"].isin(["table1", "fig13"])]
    errors = main["rel_error"].abs() * 100
    return [
        {
            "case": "fidelity-mean",
            "status": "ok",
            "figure": round(float(errors.mean()), 3),
            "unit": "%",
            "wall_s": round(wall, 2),
            "detail": f"{len(main)} rows",
        },
        {
            "case": "fidelity-max",
            "status": "ok",
            "figure": round(float(errors.max()), 3),
            "unit": "%",
            "wall_s": round(wall, 2),
            "detail": f"{len(main)} rows",
        },
    ]


COMMITTED = "results/bench_regress.csv"


def committed(path: str) -> dict[str, dict]:
    """The rows of the CSV as committed at HEAD, by case (empty when it is not committed yet)."""
    import pandas as pd

    shown = subprocess.run(
        ["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True
    )
    if shown.returncode:
        return {}
    return {r["case"]: r for r in pd.read_csv(io.StringIO(shown.stdout)).to_dict("records")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", default=",".join(list(CASES) + ["fidelity"]))
    parser.add_argument("--out", default="results/bench_regress.csv")
    args = parser.parse_args(argv)
    # the committed figures are results/bench_regress.csv's, wherever this run writes
    before = committed(COMMITTED)
    rows = []
    for case in args.cases.split(","):
        if case not in CASES and case != "fidelity":
            raise SystemExit(
                f"--cases: unknown case {case!r} (known: {', '.join(CASES)}, fidelity)"
            )
        found = run_fidelity() if case == "fidelity" else [{"case": case, **run_cli(CASES[case])}]
        for row in found:
            old = before.get(row["case"], {})
            row["committed_figure"] = old.get("figure")
            row["committed_wall_s"] = old.get("wall_s")
            row["wall_ratio"] = (
                round(row["wall_s"] / old["wall_s"], 3) if old.get("wall_s") else None
            )
            print(
                f"{row['case']:14s} {row['status']:10s} {row.get('figure')!s:>22s} (committed "
                f"{row['committed_figure']!s}) {row.get('unit', '')}; wall {row['wall_s']} s "
                f"(committed {row['committed_wall_s']}); {row.get('detail', '')}",
                flush=True,
            )
            rows.append(row)
    write_csv(args.out, with_provenance(rows, "benchmarks/regress.py", args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
