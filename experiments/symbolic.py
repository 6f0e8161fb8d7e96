"""SMSG's symbolic premise against the datasheet: how often the exact plan under the ``symbolic``
profile (per-device volumes in one unit, 1,000 FLOPs = 1 byte moved = 1 ns, every byte charged:
``planner.cluster.profiles.SYMBOLIC``) equals the exact plan under a100-80g's datasheet constants,
operator by operator, over the zoo on 8, 2x4 and 8x8 devices; and what the symbolic plan costs on
the A100, against the A100's own plan (both without a memory limit: memory is not SMSG's premise).

    agree      operators whose strategy (the dim per mesh axis) is the same in both plans
    slowdown   objective of the symbolic plan re-costed on a100-80g / the A100 plan's objective

    python -m experiments.symbolic [--models ...] [--meshes 8,2x4,8x8] [--out results/symbolic.csv]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import planner
from experiments.common import add_output_options, png_path, pyplot, results_table, run, write_png

# the zoo's models whose exact plans on these meshes are OPTIMAL within the time limit on 2 cores
# (t5-3b ends FEASIBLE on 2x4 and 8x8 at 60 s: its agreement would depend on the machine); the
# largest (GPT-3 175B, LLaMA 3 70B/405B, Mixtral) are left out for time
MODELS = (
    "mlp,transformer-block,gpt2-small,gpt2-medium,gpt3-1.3b,gpt3-13b,moe-gpt,llama3-8b,"
    "bert-base,bert-large,resnet50,wide-resnet50-2,vgg16,vit-h14"
)
DATASHEET = "a100-80g"


def row(model: str, mesh: str, time_limit_s: float) -> dict:
    """One model on one mesh: both exact plans, their agreement and the symbolic plan's cost on
    the datasheet device."""
    start = time.perf_counter()
    sheet = planner.plan(model, mesh, DATASHEET, memory=math.inf, time_limit_s=time_limit_s)
    symbolic = planner.plan(model, mesh, "symbolic", memory=math.inf, time_limit_s=time_limit_s)
    assignment = {o.name: dict(o.strategy) for o in symbolic.operators}
    recosted = planner.evaluate(model, mesh, DATASHEET, assignment=assignment, memory=math.inf)
    same = sum(a.strategy == b.strategy for a, b in zip(sheet.operators, symbolic.operators))
    sharded = sum(any(d is not None for _, d in o.strategy) for o in symbolic.operators)
    return {
        "model": model,
        "mesh": mesh,
        "status": symbolic.status,
        "operators": len(sheet.operators),
        "agree": same,
        "agree_share": same / len(sheet.operators),
        "symbolic_sharded": sharded,
        "datasheet_status": sheet.status,
        "symbolic_status": symbolic.status,
        "datasheet_objective": sheet.objective,
        "symbolic_on_datasheet_objective": recosted.objective,
        "slowdown": recosted.objective / sheet.objective,
        "wall_time_s": time.perf_counter() - start,
    }


def plot(rows: list[dict], path: str) -> None:
    """Per mesh, each model's share of operators with the datasheet plan's strategy."""
    plt = pyplot()
    models = list(dict.fromkeys(r["model"] for r in rows))
    meshes = list(dict.fromkeys(r["mesh"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(4, len(models)), 3))
    width = 0.8 / len(meshes)
    for k, mesh in enumerate(meshes):
        share = {r["model"]: r["agree_share"] for r in rows if r["mesh"] == mesh}
        ax.bar(
            [i + k * width for i in range(len(models))],
            [share.get(m, 0) for m in models],
            width,
            label=mesh,
        )
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(models))], models, rotation=45)
    ax.set(ylabel="same strategy as a100-80g", ylim=(0, 1.05))
    ax.legend(fontsize=7)
    write_png(path, fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--meshes", default="8,2x4,8x8")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true", help="gpt2-small and bert-large")
    parser.add_argument("--smallest", action="store_true", help="mlp on 8 and 2x4 (tests)")
    add_output_options(parser, "results/symbolic.csv")
    args = parser.parse_args(argv)
    if args.quick:
        args.models = "gpt2-small,bert-large"
    if args.smallest:
        args.models, args.meshes = "mlp", "8,2x4"
    table = results_table(args, ("model", "mesh"))
    for model in args.models.split(","):
        for mesh in args.meshes.split(","):
            if not table.done(model=model, mesh=mesh):
                found = row(model, mesh, args.time_limit)
                print(
                    {k: found[k] for k in ("model", "mesh", "agree_share", "slowdown")}, flush=True
                )
                table.add([found])
    # the totals per mesh and over all are the docs table's (experiments/tables_grid.symbolic)
    if png := png_path(args):
        plot(table.rows, png)
    table.finish()
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
