"""Exact under the device's real memory: the exact search on every zoo model and GPT-3-shaped
stacks.

Each row plans one model on one mesh of a100-80g at the default memory limit (the device's
memory less the runtime's reserve) with the exact method, and reports its status, search time,
objective and, when memory binds, the sizes of the Pareto search (largest front of a segment
table, most labels kept at one boundary layout). Where memory binds and the whole program can be
built, the whole-program CP-SAT (``--whole-limit`` seconds) runs beside it: ``whole_status``,
``whole_objective``, ``whole_bound`` and ``objectives_equal``. With ``--decide
none,recompute,zero,both`` (the
default, with ``--decide``) more rows per model and mesh where memory binds (or nothing fits) let
the search choose recompute, the ZeRO stage, or both per layer (``decide`` column;
``layer_recompute``
and ``layer_zero``: its choice).

    python -m experiments.memory_bound [--quick] [--models ...] [--meshes 8,2x4,8x8,4x8x8] [--out
    results/memory_bound.csv]
"""

from __future__ import annotations

import argparse
import re
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

GPT3 = "gpt:layers={},hidden=12288,heads=96,seq=2048,vocab=51200"
MESHES = "8,2x4,8x8,4x8x8"
SIZES = re.compile(r"fronts of up to (\d+) points, up to (\d+) labels")


def models(args: argparse.Namespace) -> list[str]:
    if args.smallest:
        return ["mlp", GPT3.format(2)]
    if args.models:
        return args.models.split(",")
    zoo = planner.model_names() if not args.quick else ["mlp", "gpt2-small", "resnet50"]
    return zoo + [
        GPT3.format(layers) for layers in ((12, 24, 48, 96) if not args.quick else (12, 96))
    ]


DECIDE = {
    "none": {},
    "recompute": {"recompute": "auto"},
    "zero": {"zero": "auto"},
    "both": {"recompute": "auto", "zero": "auto"},
}


def run_row(model: str, mesh: str, decide: str, args: argparse.Namespace) -> dict:
    row = {"model": model, "mesh": mesh, "decide": decide, "device": args.device}
    start = time.perf_counter()
    try:
        plan = planner.plan(
            model,
            mesh,
            args.device,
            time_limit_s=args.time_limit,
            settings=planner.TrainingSettings(**DECIDE[decide]),
        )
    except planner.PlannerError as exc:
        return {
            **row,
            "status": "REFUSED",
            "notes": str(exc),
            "search_time_s": time.perf_counter() - start,
        }
    binds = any("memory binds" in note for note in plan.notes)
    sizes = next((SIZES.search(n) for n in plan.notes if SIZES.search(n)), None)
    row.update(
        status=plan.status,
        search_time_s=plan.search_time_s,
        wall_time_s=time.perf_counter() - start,
        objective=plan.objective,
        estimated_step_time_s=plan.estimated_step_time_s,
        memory_gib=gib(plan.memory_per_device_bytes),
        memory_limit_gib=(plan.memory_limit_bytes or 0) / 2**30,
        memory_binds=binds,
        front_points=int(sizes.group(1)) if sizes else None,
        labels=int(sizes.group(2)) if sizes else None,
        notes=" | ".join(plan.notes),
        layer_recompute=dict(plan.settings).get("layer_recompute", ""),
        layer_zero=dict(plan.settings).get("layer_zero", ""),
    )
    # the whole program does not choose per layer
    if binds and args.whole_limit > 0 and decide == "none":
        row.update(_whole(model, mesh, args, plan.objective))
    return row


def _whole(model: str, mesh: str, args: argparse.Namespace, objective: int) -> dict:
    """The whole-program CP-SAT's columns for a row where memory binds."""
    try:
        whole = planner.plan(
            model, mesh, args.device, method="whole", time_limit_s=args.whole_limit
        )
    except planner.PlannerError as exc:
        return {"whole_status": "REFUSED", "whole_notes": str(exc)}
    return {
        "whole_status": whole.status,
        "whole_objective": whole.objective,
        "whole_bound": whole.bound,
        "whole_time_s": whole.search_time_s,
        "objectives_equal": whole.objective == objective,
    }


SHOWN = (
    "model",
    "mesh",
    "decide",
    "status",
    "search_time_s",
    "memory_binds",
    "front_points",
    "labels",
    "whole_status",
    "objectives_equal",
    "layer_recompute",
    "layer_zero",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models",
        help="comma-separated models (default: the zoo and GPT-3 shapes of 12-96 layers)",
    )
    parser.add_argument("--meshes", default=MESHES)
    parser.add_argument("--device", default="a100-80g")
    parser.add_argument(
        "--decide",
        default="none,recompute,zero,both",
        help="comma-separated: none, and what the search chooses per layer (recompute, zero, "
        "both); those rows only where memory binds or nothing fits without them",
    )
    parser.add_argument(
        "--time-limit", type=float, default=120.0, help="exact search limit per row (s)"
    )
    parser.add_argument(
        "--whole-limit", type=float, default=60.0, help="whole-program CP-SAT limit (s; 0: skip)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="three zoo models and GPT-3 shapes of 12 and 96 layers"
    )
    parser.add_argument(
        "--smallest", action="store_true", help="mlp and a 2-layer GPT-3 shape on mesh 8 (tests)"
    )
    add_output_options(parser, "results/memory_bound.csv")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.smallest:
        args.meshes = "8"
    modes = args.decide.split(",")
    unknown = [m for m in modes if m not in DECIDE]
    if unknown:
        parser.error(f"--decide: unknown choice {unknown[0]!r} (known: {', '.join(DECIDE)})")
    table = results_table(args, ("model", "mesh", "decide"))
    for model in models(args):
        for mesh in args.meshes.split(","):
            binds = True  # per-layer rows only where the plain row's memory binds
            for decide in modes:
                if table.done(model=model, mesh=mesh, decide=decide) or (
                    decide != "none" and not binds
                ):
                    continue
                row = run_row(model, mesh, decide, args)
                if decide == "none":
                    binds = bool(row.get("memory_binds")) or row["status"] == "INFEASIBLE"
                print({k: row.get(k) for k in SHOWN}, flush=True)
                table.add([row])
    table.finish()
    if png := png_path(args):
        plot(table.rows, png)
    return 0


def plot(rows: list[dict], path: str) -> None:
    """Search time per row, memory-bound rows marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3))
    shown = [r for r in rows if r.get("status") not in ("REFUSED", None)]
    for binds, marker in ((False, "o"), (True, "x")):
        sel = [(k, r) for k, r in enumerate(shown) if bool(r.get("memory_binds")) == binds]
        ax.scatter(
            [k for k, _ in sel],
            [max(float(r["search_time_s"]), 1e-3) for _, r in sel],
            marker=marker,
            label="memory binds" if binds else "memory free",
        )
    ax.set(yscale="log", xlabel="row (model x mesh)", ylabel="exact search time (s)")
    ax.legend(fontsize=7)
    write_png(path, fig)


if __name__ == "__main__":
    sys.exit(run(main))
