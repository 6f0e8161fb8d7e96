"""Benchmark: `planner verify` on every zoo model at its default sizes either completes or refuses
within 5 s, with peak RSS under 8 GB.

For each model: `planner plan --method dp` on the mesh (a valid plan at the default batch; the
memory guard does not depend on how the plan was found), then `planner verify --plan` in a child
process whose peak RSS (all its descendants, the XLA subprocess included) and wall time are
measured. Writes results/bench_verify_memory.csv. Usage: python benchmarks/verify_memory.py [--mesh
8] [--timeout S] [--models a,b]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the experiments package
from experiments.common import with_provenance  # noqa: E402
from planner import model_names
from planner.outputs import write_csv

MEASURE = (
    "import resource, subprocess, sys, time; t = time.perf_counter(); p = "
    "subprocess.run(sys.argv[1:], capture_output=True, text=True); print(p.returncode, "
    "time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); "
    "print((p.stderr or p.stdout).strip().splitlines()[-1] if (p.stderr or p.stdout).strip() else "
    "'')"
)


def run_one(model: str, mesh: str, timeout: float, workdir: Path) -> dict:
    plan = workdir / f"{model}.json"
    made = subprocess.run(
        [sys.executable, "-m", "planner", "plan", "--model", model, "--mesh", mesh]
        + ["--method", "dp", "--memory", "none", "--json", str(plan), "-q"],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        return {
            "model": model,
            "mesh": mesh,
            "outcome": "no plan",
            "detail": made.stderr.strip()[-200:],
        }
    try:
        proc = subprocess.run(
            [sys.executable, "-c", MEASURE, sys.executable, "-m", "planner", "verify"]
            + ["--plan", str(plan)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"model": model, "mesh": mesh, "outcome": "timeout", "wall_s": timeout}
    first, _, detail = proc.stdout.partition("\n")
    code, wall, rss = first.split()
    outcome = {"0": "completed", "2": "refused", "5": "mismatch"}.get(code, f"exit {code}")
    return {
        "model": model,
        "mesh": mesh,
        "outcome": outcome,
        "exit_code": int(code),
        "wall_s": float(wall),
        "peak_rss_gb": int(rss) / 1e9,
        "detail": detail.strip()[:200],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mesh", default="8")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--models", default=",".join(model_names()))
    parser.add_argument("--out", default="results/bench_verify_memory.csv")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            row = run_one(model, args.mesh, args.timeout, Path(tmp))
            rows.append(row)
            print(json.dumps(row), flush=True)
    write_csv(args.out, with_provenance(rows, "benchmarks/verify_memory.py", args))
    ok = all(
        r["outcome"] in ("completed", "refused", "mismatch")
        and r.get("peak_rss_gb", 0) < 8
        and (r["outcome"] != "refused" or r["wall_s"] <= 5)
        for r in rows
    )
    print(
        f"{sum(r['outcome'] == 'completed' for r in rows)} completed, "
        f"{sum(r['outcome'] == 'refused' for r in rows)} refused, max peak RSS "
        f"{max(r.get('peak_rss_gb', 0) for r in rows):.2f} GB: {'ok' if ok else 'TARGET MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
