"""Search time of the exact planner (decomposition) against the whole-graph program as models
deepen.

GPT with hidden 12288, 96 heads, seq 2048 (GPT-3 175B layer shapes) at 12, 24, 48 and 96 layers on
meshes 8, 8x8 and 4x8x8 of a100-80g, global batch 8. Two memory settings: `none` (pure search
scaling) and `device` (80 GB per device, where memory binds). The whole-graph program runs with a
time limit beside the decomposition (memory `none` only; skipped where it is too large to build).

    python -m experiments.scaling [--quick] [--layers 12,24,48,96] [--meshes 8,8x8,4x8x8] [--out
    results/scaling.csv] [--resume]
"""

from __future__ import annotations

import argparse
import sys

import planner
from experiments.common import add_output_options, png_path, pyplot, results_table, run, write_png

MODEL = "gpt:layers={layers},hidden=12288,heads=96,seq=2048,vocab=51200"


def _whole(model: str, mesh: str, time_limit_s: float, exact_s: float) -> dict:
    """The whole-graph program's columns beside the decomposition's (no memory limit)."""
    whole = planner.plan(
        model, mesh, "a100-80g", method="whole", memory=float("inf"), time_limit_s=time_limit_s
    )
    return {
        "whole_status": whole.status,
        "whole_objective": whole.objective,
        "whole_search_time_s": round(whole.search_time_s, 3),
        "speedup": round(whole.search_time_s / max(exact_s, 1e-9), 1)
        if whole.status in ("OPTIMAL", "FEASIBLE")
        else None,
    }


def run_one(
    n: int,
    mesh: str,
    memory: str,
    whole_time_limit: float,
    exact_time_limit: float = 60.0,
    repeats: int = 3,
) -> dict:
    model = MODEL.format(layers=n)
    limit = None if memory == "none" else 80e9
    # Best of `repeats` runs (no-limit rows only; they take well under a second): the
    # 12-to-96-layer ratio must not hinge on one garbage-collection pause.
    runs = [
        planner.plan(
            model,
            mesh,
            "a100-80g",
            method="exact",
            memory=limit if limit else float("inf"),
            time_limit_s=exact_time_limit,
        )
        for _ in range(repeats if limit is None else 1)
    ]
    exact = min(runs, key=lambda p: p.search_time_s)
    row = {
        "model": "gpt-h12288",
        "layers": n,
        "mesh": mesh,
        "memory": memory,
        "method": "exact",
        "status": exact.status,
        "objective": exact.objective,
        "search_time_s": round(exact.search_time_s, 3),
        "notes": " | ".join(exact.notes),
    }
    if memory == "none":
        row.update(_whole(model, mesh, whole_time_limit, exact.search_time_s))
    return row


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for mesh, memory in sorted({(r["mesh"], r["memory"]) for r in rows}):
        sel = sorted(
            (r for r in rows if r["mesh"] == mesh and r["memory"] == memory),
            key=lambda r: r["layers"],
        )
        ax.plot(
            [r["layers"] for r in sel],
            [r["search_time_s"] for r in sel],
            "o-",
            label=f"exact {mesh} mem={memory}",
        )
        whole = [r for r in sel if r.get("whole_status") in ("OPTIMAL", "FEASIBLE")]
        if whole:
            ax.plot(
                [r["layers"] for r in whole],
                [r["whole_search_time_s"] for r in whole],
                "x--",
                label=f"whole {mesh}",
            )
    ax.set(
        xlabel="layers",
        ylabel="search time (s)",
        yscale="log",
        title="Exact search time, GPT h=12288",
    )
    ax.legend(fontsize=7)
    write_png(path, fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", default="12,24,48,96")
    parser.add_argument("--meshes", default="8,8x8,4x8x8")
    parser.add_argument("--memories", default="none,device")
    parser.add_argument("--whole-time-limit", type=float, default=60.0)
    parser.add_argument(
        "--quick", action="store_true", help="12 and 96 layers on 8x8, whole limit 20 s"
    )
    parser.add_argument(
        "--smallest",
        action="store_true",
        help="12 layers on 8, no memory limit, whole limit 5 s (tests)",
    )
    add_output_options(parser, "results/scaling.csv")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.meshes, args.whole_time_limit = "12,96", "8x8", 20.0
    if args.smallest:
        args.layers, args.meshes, args.memories, args.whole_time_limit = "12", "8", "none", 5.0
    table = results_table(args, ("layers", "mesh", "memory"))
    for mesh in args.meshes.split(","):
        for n in [int(x) for x in args.layers.split(",")]:
            for memory in args.memories.split(","):
                if table.done(layers=n, mesh=mesh, memory=memory):
                    continue
                row = run_one(n, mesh, memory, args.whole_time_limit)
                print(row, flush=True)
                table.add([row])
    table.finish()
    if png := png_path(args):
        plot(table.rows, png)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
