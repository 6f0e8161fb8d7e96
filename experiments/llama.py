"""LLaMA 3 on H100s: intra-operator plans of LLaMA-3 8B by every method, and 3D plans of 70B and
405B.

Intra-operator: ``llama3-8b`` (seq 8192, global batch 8) on meshes 8, 2x4 and 8x8 of h100-80g with
exact, sapp, drec-cost, megatron, dp and zero (one ``planner.compare`` per mesh, so gaps are to the
exact plan under the same cost model). 3D: ``llama3-70b`` (batch 512 sequences of 8192 tokens, 4M
tokens as LLaMA 3 trains) on 64 to 1024 H100s and ``llama3-405b`` (batch 2048, 16M tokens) on 1024
to 16384, nodes of 8: search time, iteration time and the chosen degrees (tensor, pipeline, data),
micro-batches, recompute and memory.

    python -m experiments.llama [--quick] [--smallest] [--threed-models M] [--out results/llama.csv]
"""

from __future__ import annotations

import argparse
import sys
import time

import planner
from experiments.common import (
    gib,
    add_output_options,
    png_path,
    pyplot,
    results_table,
    run,
    write_png,
)
from experiments.portability import degrees

METHODS = ("exact", "sapp", "drec-cost", "megatron", "dp", "zero")
INTRA = ("llama3-8b", ("8", "2x4", "8x8"))
THREED = (("llama3-70b", 512, (64, 256, 1024)), ("llama3-405b", 2048, (1024, 4096, 16384)))


def intra_rows(model: str, mesh: str, methods: tuple[str, ...]) -> list[dict]:
    rows = planner.compare(model, mesh, "h100-80g", methods=methods)
    return [
        {
            "part": "intra",
            "model": r["model"],
            "devices": planner.make_cluster(mesh, "h100-80g").mesh.num_devices,
            "mesh": r["mesh"],
            "method": r["method"],
            "status": r["status"],
            "objective": r["objective"],
            "iteration_time_s": r["estimated_step_time_s"],
            "gap_to_exact_percent": r["gap_to_exact_percent"],
            "max_memory_gib": gib(r["memory_per_device_bytes"]),
            "fits_memory": r["fits_memory"],
            "search_time_s": r["search_time_s"],
        }
        for r in rows
    ]


def threed_row(model: str, batch: int, devices: int) -> dict:
    row = {
        "part": "3d",
        "model": model,
        "devices": devices,
        "batch": batch,
        "method": "exact+csimd",
    }
    start = time.perf_counter()
    try:
        result = planner.plan_pipeline(model, devices=devices, device="h100-80g", batch=batch)
    except planner.PlannerError as exc:
        return {
            **row,
            "status": "INFEASIBLE",
            "notes": str(exc),
            "search_time_s": time.perf_counter() - start,
        }
    chosen = degrees(result)
    return {
        **row,
        "mesh": result.mesh,
        "status": result.status,
        **chosen,
        "num_microbatches": result.pipeline.num_microbatches,
        "micro_batch": batch
        // result.pipeline.num_microbatches
        // max(1, chosen["data_parallel_degree"]),
        "sequence_parallel": result.settings.sequence_parallel,
        "recompute": result.settings.recompute,
        "zero": result.settings.zero,
        "objective": result.pipeline.iteration_time_s,
        "iteration_time_s": result.pipeline.iteration_time_s,
        "max_memory_gib": result.pipeline.max_memory_bytes / 2**30,
        "fits_memory": True,
        "search_time_s": result.search_time_s,
        "wall_time_s": time.perf_counter() - start,
    }


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for model in sorted({r["model"] for r in rows if r["part"] == "3d"}):
        sel = sorted(
            (
                r
                for r in rows
                if r["model"] == model and r["part"] == "3d" and r.get("iteration_time_s")
            ),
            key=lambda r: r["devices"],
        )
        ax.plot(
            [r["devices"] for r in sel], [r["iteration_time_s"] for r in sel], "o-", label=model
        )
    ax.set(
        xlabel="H100 GPUs",
        ylabel="iteration time (s)",
        xscale="log",
        yscale="log",
        title="LLaMA 3, 3D plans",
    )
    ax.legend(fontsize=7)
    write_png(path, fig)


def _cases(args, parser: argparse.ArgumentParser) -> tuple:
    """(intra-node model and meshes, 3D cases, methods) of the options."""
    intra, threed, methods = INTRA, THREED, METHODS
    if args.quick:
        intra, threed = (
            ("llama3-8b", ("8x8",)),
            (("llama3-70b", 512, (64,)), ("llama3-405b", 2048, (1024,))),
        )
    if args.smallest:
        tiny = "llama:layers=2,hidden=256,heads=8,kv_heads=2,ffn=512,seq=256,vocab=1024"
        intra, threed, methods = (tiny, ("8",)), ((tiny, 16, (16,)),), ("exact", "sapp", "dp")
    if args.threed_models:
        wanted = args.threed_models.split(",")
        unknown = sorted(set(wanted) - {case[0] for case in threed})
        if unknown:
            parser.error(f"--threed-models: {', '.join(unknown)} not among the 3D cases")
        threed = tuple(case for case in threed if case[0] in wanted)
    return intra, threed, methods


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="8x8 only; 70B on 64 and 405B on 1024")
    parser.add_argument(
        "--smallest", action="store_true", help="a 2-layer LLaMA on 8, 3D on 16 devices (tests)"
    )
    parser.add_argument(
        "--threed-models",
        default="",
        help="comma-separated: only these of the 3D cases (default: every one of the set)",
    )
    add_output_options(parser, "results/llama.csv")
    args = parser.parse_args(argv)
    intra, threed, methods = _cases(args, parser)
    table = results_table(args, ("part", "model", "devices", "mesh", "method"))
    model, meshes = intra
    for mesh in meshes:
        spec = planner.make_cluster(mesh, "h100-80g").mesh.spec
        if not table.done(
            part="intra", model=planner.load_model(model).name, mesh=spec, method=methods[-1]
        ):
            rows = intra_rows(model, mesh, methods)
            print(*rows, sep="\n", flush=True)
            table.add(rows)
    for model, batch, device_counts in threed:
        for devices in device_counts:
            if not table.done(part="3d", model=model, devices=devices, method="exact+csimd"):
                row = threed_row(model, batch, devices)
                print(row, flush=True)
                table.add([row])
    table.finish()
    if png := png_path(args):
        plot(table.rows, png)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
