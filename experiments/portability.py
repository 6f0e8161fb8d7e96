"""Portability (the SMSG claim, measured): re-plan a fixed model when the setting changes.

For each GPT model, starting from a base setting (64 devices in nodes of 8, a100-80g, InfiniBand,
global batch 256), change one thing at a time: the global batch (x1/4 .. x4), the device count
(8 .. 1024), the device profile (v100-16g, a100-80g, h100-80g) and the inter-node bandwidth
(per GPU: 25 Gb/s Ethernet, 100, 200 Gb/s HDR and 400 Gb/s NDR InfiniBand). The v100-16g profile
keeps its datasheet network, 25 Gb/s Ethernet per node (3.1 Gb/s per GPU, see hardware.csv): the
slow-network case. Each row is one 3D plan (`planner.plan_pipeline`): re-planning time (there is
no profiling step) and the chosen degrees: pipeline stages, data parallel, tensor parallel inside
the node and across nodes (`inter_node_bandwidth_gbps` is per GPU).

    python -m experiments.portability [--quick] [--models gpt3-1.3b,gpt3-6.7b,gpt3-13b] [--out
    results/portability.csv]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

import planner
from planner.cluster.profiles import get_profile
from experiments.common import add_output_options, png_path, pyplot, results_table, run, write_png

BASE = {"devices": 64, "device": "a100-80g", "inter_gbps": None, "batch": 256}
GBPS = 1e9 / 8  # bytes/s per Gb/s


def variations(base: dict, quick: bool) -> list[tuple[str, dict]]:
    """(what changed, setting) pairs; the base setting comes first."""
    batches = [64, 1024] if quick else [64, 128, 512, 1024]
    devices = [8, 512] if quick else [8, 16, 32, 128, 256, 512, 1024]
    out = [("base", dict(base))]
    out += [("batch", {**base, "batch": b}) for b in batches]
    out += [("devices", {**base, "devices": d}) for d in devices]
    out += [("device", {**base, "device": d}) for d in ("v100-16g", "h100-80g")]
    out += [
        ("inter_gbps", {**base, "inter_gbps": g})
        for g in ((25, 400) if quick else (25, 100, 200, 400))
    ]
    return out


def degrees(result) -> dict:
    """Pipeline, data and tensor-parallel degrees of a 3D plan, from its layout (tensor parallel
    across nodes: on a tensor axis of the ``node`` level)."""
    layout = result.layout
    tp_inter = math.prod(a.size for a in layout.tensor_axes if a.level == "node")
    return {
        "pipeline_degree": layout.pipeline_degree,
        "data_parallel_degree": layout.data_parallel_degree,
        "tensor_parallel_intra_node": layout.tensor_parallel_degree // tp_inter,
        "tensor_parallel_inter_node": tp_inter,
        "tensor_parallel_degree": layout.tensor_parallel_degree,
        "stage_mesh": layout.stage_mesh,
        "split_dims": " ".join(f"{a}:{d or '-'}" for a, d in result.tensor_parallel_dims),
    }


def plan_row(model: str, changed: str, setting: dict) -> dict:
    profile = get_profile(setting["device"])
    if setting["inter_gbps"] is not None:
        profile = dataclasses.replace(
            profile,
            inter_node_bandwidth=setting["inter_gbps"] * GBPS,
            name=f"{profile.name}@{setting['inter_gbps']}Gbps",
        )
    row = {
        "model": model,
        "changed": changed,
        **setting,
        "inter_node_bandwidth_gbps": profile.inter_node_bandwidth / GBPS,
    }
    start = time.perf_counter()
    try:
        result = planner.plan_pipeline(
            model, devices=setting["devices"], device=profile, batch=setting["batch"]
        )
    except planner.PlannerError as exc:
        return {
            **row,
            "status": "INFEASIBLE",
            "notes": str(exc),
            "replan_time_s": time.perf_counter() - start,
        }
    row.update(
        {
            "status": result.status,
            **degrees(result),
            "num_microbatches": result.pipeline.num_microbatches,
            "sequence_parallel": result.settings.sequence_parallel,
            "recompute": result.settings.recompute,
            "zero": result.settings.zero,
            "objective": result.pipeline.iteration_time_s,
            "iteration_time_s": result.pipeline.iteration_time_s,
            "max_memory_gib": result.pipeline.max_memory_bytes / 2**30,
            "replan_time_s": time.perf_counter() - start,
        }
    )
    return row


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for model in sorted({r["model"] for r in rows}):
        sel = sorted(
            (
                r
                for r in rows
                if r["model"] == model
                and r["changed"] in ("base", "devices")
                and r["status"] == "HEURISTIC"
            ),
            key=lambda r: r["devices"],
        )
        ax.plot([r["devices"] for r in sel], [r["replan_time_s"] for r in sel], "o-", label=model)
    ax.set(
        xscale="log",
        xlabel="devices",
        ylabel="re-planning time (s)",
        title="Re-planning cost (no profiling)",
    )
    ax.legend(fontsize=7)
    write_png(path, fig)


SHOWN = (
    "model",
    "changed",
    "devices",
    "device",
    "inter_gbps",
    "batch",
    "status",
    "pipeline_degree",
    "data_parallel_degree",
    "tensor_parallel_intra_node",
    "tensor_parallel_inter_node",
    "replan_time_s",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="gpt3-1.3b,gpt3-6.7b,gpt3-13b")
    parser.add_argument(
        "--quick", action="store_true", help="gpt3-1.3b and gpt3-13b, fewer variations"
    )
    parser.add_argument(
        "--smallest",
        action="store_true",
        help="gpt3-1.3b, base and the v100/Ethernet setting (tests)",
    )
    add_output_options(parser, "results/portability.csv")
    args = parser.parse_args(argv)
    if args.quick:
        args.models = "gpt3-1.3b,gpt3-13b"
    table = results_table(args, ("model", "changed", "devices", "device", "inter_gbps", "batch"))
    for model in args.models.split(","):
        settings = variations(BASE, args.quick or args.smallest)
        if args.smallest:
            model, settings = (
                "gpt3-1.3b",
                [s for s in settings if s[0] == "base" or s[1]["device"] == "v100-16g"],
            )
        for changed, setting in settings:
            if table.done(model=model, changed=changed, **setting):
                continue
            row = plan_row(model, changed, setting)
            print({k: row.get(k) for k in SHOWN}, flush=True)
            table.add([row])
        if args.smallest:
            break
    table.finish()
    if png := png_path(args):
        plot(table.rows, png)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
