"""Pipeline planning: CSIMD against the exact DP (and baselines) on random chains and zoo models.

Random chains: heterogeneous layer times, nonlinear in the micro-batch size (see
experiments.chains.random_chain), 2-8 stages, with and without a binding memory limit. Zoo models:
the layer chain of the exact intra-operator plan on a stage sub-mesh. Columns: source, layers,
stages, method, status, objective (iteration time, s), gap to the exact DP in percent, evaluations,
search time, micro-batches.

    python -m experiments.pipeline [--quick] [--instances 1000] [--out results/pipeline.csv]
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

import planner
from planner.pipeline.search import METHODS as PIPELINE_METHODS
from experiments.chains import random_chain
from experiments.common import add_output_options, png_path, pyplot, results_table, run, write_png

# (model, mesh, global batch, recompute): GPT-3 175B needs full recompute to fit 80 GB in 4 stages.
ZOO = (
    ("gpt3-13b", "node=8,gpu=8", 128, False),
    ("gpt3-175b", "node=128,gpu=8", 1536, True),
    ("bert-large", "node=4,gpu=8", 64, False),
    ("resnet152", "node=4,gpu=8", 256, False),
    ("vgg16", "node=4,gpu=8", 256, False),
)
METHODS = ("csimd", "exact", "even", "balanced")


def compare_chain(
    chain, stages: int, memory: float | None, source: str, instance: int
) -> list[dict]:
    limit = math.inf if memory is None else memory  # the CSV leaves "no limit" empty
    plans = {m: PIPELINE_METHODS[m](chain, stages, "1f1b", limit) for m in METHODS}
    exact = plans["exact"].iteration_time_s
    rows = []
    for method, p in plans.items():
        gap = (
            100.0 * (p.iteration_time_s / exact - 1)
            if np.isfinite(exact) and np.isfinite(p.iteration_time_s)
            else None
        )
        rows.append(
            {
                "source": source,
                "instance": instance,
                "layers": chain.num_layers,
                "stages": stages,
                "memory_limit": memory,
                "method": method,
                "status": p.status,
                "objective": p.iteration_time_s,
                "gap_to_exact_percent": gap,
                "evaluations": p.evaluations,
                "search_time_s": p.search_time_s,
                "num_microbatches": p.num_microbatches,
                "fits_memory": p.fits_memory,
            }
        )
    if plans["csimd"].fits_memory is False and plans["csimd"].status == "HEURISTIC":
        raise SystemExit(f"CSIMD violated memory on {source}")
    return rows


def random_configs(instances: int, big: list[int]):
    """(source, instance, chain builder, stages, memory) of every random chain, in a fixed order."""
    rng = np.random.default_rng(2026)
    for k in range(instances):
        layers = int(rng.integers(8, 65))
        stages = int(rng.choice([2, 4, 8]))
        chain = random_chain(k, layers)
        memory = float(chain.static_memory.sum() / stages * 1.5 + 1e9) if k % 2 else None
        yield "random", k, (lambda chain=chain: chain), stages, memory
    for layers in big:
        yield "random-large", layers, (lambda layers=layers: random_chain(layers, layers)), 8, None


def zoo_configs(models):
    for model, mesh, batch, recompute in models:
        settings = planner.TrainingSettings(recompute=recompute, zero=1 if recompute else 0)
        build = lambda model=model, mesh=mesh, batch=batch, settings=settings: (
            planner.layer_chain(model, mesh, stages=4, batch=batch, settings=settings).chain
        )
        yield model, 0, build, 4, 80e9


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method in METHODS[:1] + METHODS[2:]:
        gaps = sorted(
            r["gap_to_exact_percent"]
            for r in rows
            if r["method"] == method
            and r["source"] == "random"
            and r["gap_to_exact_percent"] is not None
        )
        if gaps:
            ax.plot(gaps, [(i + 1) / len(gaps) for i in range(len(gaps))], label=method)
    ax.set(
        xlabel="gap to the exact DP (%)",
        ylabel="fraction of instances",
        xscale="symlog",
        title="Pipeline plans on random chains",
    )
    ax.legend(fontsize=7)
    write_png(path, fig)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument(
        "--big", default="96,200,500,1000", help="layer counts of the large random chains"
    )
    parser.add_argument(
        "--zoo", default=",".join(z[0] for z in ZOO), help="zoo models to chain ('' for none)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="100 instances, large chains 96 and 200, two zoo models",
    )
    parser.add_argument(
        "--smallest", action="store_true", help="5 random instances, no zoo model (tests)"
    )
    add_output_options(parser, "results/pipeline.csv")
    args = parser.parse_args(argv)
    if args.quick:
        args.instances, args.big, args.zoo = 100, "96,200", "bert-large,vgg16"
    if args.smallest:
        args.instances, args.big, args.zoo = 5, "", ""
    return args


SHOWN = ("source", "layers", "method", "gap_to_exact_percent", "evaluations", "search_time_s")


def _report(rows: list[dict]) -> None:
    """CSIMD's share of random chains within 1% of the exact DP, and every non-random row."""
    csimd = [
        r
        for r in rows
        if r["method"] == "csimd"
        and r["source"] == "random"
        and r["gap_to_exact_percent"] is not None
    ]
    within = sum(r["gap_to_exact_percent"] <= 1.0 for r in csimd)
    print(f"CSIMD within 1% of the exact DP on {within}/{len(csimd)} random instances")
    for r in rows:
        if r["source"] != "random":
            print({k: r[k] for k in SHOWN})


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    models = [z for z in ZOO if z[0] in args.zoo.split(",")]
    table = results_table(args, ("source", "instance"))
    configs = list(
        random_configs(args.instances, [int(x) for x in args.big.split(",") if x])
    ) + list(zoo_configs(models))
    for source, instance, build, stages, memory in configs:
        if not table.done(source=source, instance=instance):
            table.add(compare_chain(build(), stages, memory, source, instance))
    table.finish()
    _report(table.rows)
    if png := png_path(args):
        plot(table.rows, png)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
