"""Linear time of ``--method sapp`` (SMSG's D-Rec as MindSpore's SAPP): search time per operator as
GPT models deepen, the ratio of 96 to 12 layers printed in the same run.

GPT with GPT-3 175B layer shapes (hidden 12288, 96 heads, seq 2048) at 12, 24, 48 and 96 layers, on
8 devices (topological order) and 64 devices (SAPP's weight order above 32 devices). The search
(levels, elimination, propagation) is timed alone, best of three; the plan's step time under the
planner's cost model (mesh 8 or 8x8, a100-80g) is reported beside it.

    python -m experiments.sapp_scaling [--quick] [--smallest] [--layers 12,24,48,96] [--devices
    8,64] [--out results/sapp_scaling.csv]
"""

from __future__ import annotations

import argparse
import sys
import time

import planner
from planner.search.sapp import sapp_levels
from experiments.common import add_output_options, png_path, pyplot, results_table, run, write_png

MODEL = "gpt:layers={layers},hidden=12288,heads=96,seq=2048,vocab=51200"
MESHES = {8: "8", 64: "8x8", 512: "8x8x8"}


def run_one(layers: int, devices: int, repeats: int = 3) -> dict:
    graph = planner.load_model(MODEL.format(layers=layers))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sapp_levels(graph, devices)
        times.append(time.perf_counter() - start)
    best = min(times)
    costed = planner.plan(graph, MESHES[devices], "a100-80g", method="sapp", memory=float("inf"))
    return {
        "model": "gpt-h12288",
        "layers": layers,
        "devices": devices,
        "mesh": MESHES[devices],
        "order": "weight" if devices > 32 else "topological",
        "operators": len(graph.operators),
        "method": "sapp",
        "status": costed.status,
        "objective": costed.objective,
        "estimated_step_time_s": costed.estimated_step_time_s,
        "search_time_s": round(best, 4),
        "us_per_operator": round(1e6 * best / len(graph.operators), 2),
    }


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for devices in sorted({r["devices"] for r in rows}):
        sel = sorted((r for r in rows if r["devices"] == devices), key=lambda r: r["operators"])
        ax.plot(
            [r["operators"] for r in sel],
            [r["us_per_operator"] for r in sel],
            "o-",
            label=f"{devices} devices",
        )
    ax.set(
        xlabel="operators",
        ylabel="search time per operator (us)",
        xscale="log",
        ylim=(0, None),
        title="sapp: time per operator",
    )
    ax.legend(fontsize=7)
    write_png(path, fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", default="12,24,48,96")
    parser.add_argument(
        "--devices", default="8,64", help=f"comma-separated, among {sorted(MESHES)}"
    )
    parser.add_argument("--quick", action="store_true", help="12 and 96 layers on 64 devices")
    parser.add_argument(
        "--smallest", action="store_true", help="2 and 4 layers on 8 devices (tests)"
    )
    add_output_options(parser, "results/sapp_scaling.csv")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.devices = "12,96", "64"
    if args.smallest:
        args.layers, args.devices = "2,4", "8"
    devices = [int(d) for d in args.devices.split(",")]
    if any(d not in MESHES for d in devices):
        parser.error(f"--devices: each must be one of {sorted(MESHES)}")
    table = results_table(args, ("layers", "devices"))
    for d in devices:
        for n in [int(x) for x in args.layers.split(",")]:
            if not table.done(layers=n, devices=d):
                row = run_one(n, d)
                print(row, flush=True)
                table.add([row])
    for d in devices:
        sel = {r["layers"]: r["us_per_operator"] for r in table.rows if r["devices"] == d}
        if min(sel, default=0) < max(sel, default=0):
            low, high = min(sel), max(sel)
            print(
                f"{d} devices: time per operator at {high} layers / at {low} layers = "
                f"{sel[high] / sel[low]:.2f}",
                flush=True,
            )
    table.finish()
    if png := png_path(args):
        plot(table.rows, png)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
