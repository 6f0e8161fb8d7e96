"""Across the zoo and 8 to 64 devices: step time of exact, sapp, drec-cost, dp and megatron plans,
and scaling.

Strong scaling: each model keeps one global batch (language models 64 sequences, vision models
256 images) while the devices grow from 8 (one node) to 64 (nodes of 8, a100-80g). Scaling
efficiency of a method at N devices is (T_8 * 8) / (T_N * N) with T its estimated step time
against the exact plan at the smallest device count where it fits: (T_ref * N_ref) / (T * N), so 1.0
is perfect scaling of the best plan and every method is measured against the same reference. Plans
that do not fit in memory keep their row (fits_memory False) and get no efficiency.

    python -m experiments.smsg_models [--quick] [--models ...] [--devices 8,16,32,64] [--out
    results/smsg_models.csv]
"""

from __future__ import annotations

import argparse
import sys

import planner
from experiments.common import add_output_options, png_path, pyplot, results_table, run, write_png

MODELS = "gpt3-1.3b,bert-large,resnet50,vgg16,wide-resnet50-2,moe-gpt"
METHODS = ("exact", "sapp", "drec-cost", "dp", "megatron")
VISION = ("resnet", "vgg", "wide-resnet")


def mesh_for(devices: int) -> str:
    return "8" if devices <= 8 else f"node={devices // 8},gpu=8"


def batch_for(model: str) -> int:
    return 256 if model.startswith(VISION) else 64


def add_efficiency(rows: list[dict]) -> None:
    """Scaling efficiency against the exact plan at the model's smallest device count where it
    fits."""
    for r in rows:
        fitting = [
            b
            for b in rows
            if b["model"] == r["model"] and b["method"] == "exact" and b["fits_memory"]
        ]
        base = min(fitting, key=lambda b: b["devices"]) if fitting else None
        ok = base is not None and r["fits_memory"] and r["estimated_step_time_s"] > 0
        r["scaling_efficiency"] = (
            (
                base["estimated_step_time_s"]
                * base["devices"]
                / (r["estimated_step_time_s"] * r["devices"])
            )
            if ok
            else None
        )
        r["reference_devices"] = base["devices"] if base is not None else None


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(3 * len(models), 3), squeeze=False)
    for ax, model in zip(axes[0], models):
        for method in METHODS:
            sel = sorted(
                (
                    r
                    for r in rows
                    if r["model"] == model
                    and r["method"] == method
                    and r["scaling_efficiency"] is not None
                ),
                key=lambda r: r["devices"],
            )
            ax.plot(
                [r["devices"] for r in sel],
                [r["scaling_efficiency"] for r in sel],
                "o-",
                label=method,
            )
        ticks = sorted({r["devices"] for r in rows})
        ax.set(title=model, xscale="log", xlabel="devices", ylim=(0, 1.1))
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
    axes[0][0].set_ylabel("scaling efficiency")
    axes[0][0].legend(fontsize=7)
    write_png(path, fig)


SHOWN = (
    "model",
    "devices",
    "method",
    "status",
    "estimated_step_time_s",
    "fits_memory",
    "search_time_s",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--devices", default="8,16,32,64")
    parser.add_argument("--device", default="a100-80g")
    parser.add_argument("--quick", action="store_true", help="devices 8 and 64")
    parser.add_argument(
        "--smallest",
        action="store_true",
        help="gpt2-small and resnet50 on 8 and 16 devices (tests)",
    )
    add_output_options(parser, "results/smsg_models.csv")
    args = parser.parse_args(argv)
    if args.quick:
        args.devices = "8,64"
    if args.smallest:
        args.models, args.devices = "gpt2-small,resnet50", "8,16"
    table = results_table(args, ("model", "devices"))
    for model in args.models.split(","):
        for devices in [int(d) for d in args.devices.split(",")]:
            if table.done(model=model, devices=devices):
                continue
            group = planner.compare(
                model, mesh_for(devices), args.device, methods=METHODS, batch=batch_for(model)
            )
            for r in group:
                r.update(model=model, devices=devices, batch=batch_for(model))
                print({k: r[k] for k in SHOWN}, flush=True)
            table.add(group)
    table.rows = [
        {k: v for k, v in r.items() if k not in ("scaling_efficiency", "reference_devices")}
        for r in table.rows
    ]
    add_efficiency(table.rows)
    table.add([])  # rewrite with the efficiency column
    table.finish()
    if png := png_path(args):
        plot(table.rows, png)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
