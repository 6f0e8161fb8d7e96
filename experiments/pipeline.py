"""Pipeline planning: CSIMD against the exact DP (and baselines) on random chains and zoo models.

Random chains: heterogeneous layer times, nonlinear in the micro-batch size (see
planner.random_chain), 2-8 stages, with and without a binding memory limit. Zoo models: the layer
chain of the exact intra-operator plan on a stage sub-mesh. Columns: source, layers, stages,
method, status, objective (iteration time, s), gap to the exact DP in percent, evaluations, search
time, micro-batches.

    python -m experiments.pipeline [--quick] [--instances 1000] [--out results/pipeline.csv]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import planner
from planner.io import write_csv

# (model, mesh, global batch, recompute): GPT-3 175B needs full recompute to fit 80 GB in 4 stages.
ZOO = (("gpt3-13b", "node=8,gpu=8", 128, False), ("gpt3-175b", "node=128,gpu=8", 1536, True),
       ("bert-large", "node=4,gpu=8", 64, False), ("resnet152", "node=4,gpu=8", 256, False),
       ("vgg16", "node=4,gpu=8", 256, False))
METHODS = ("csimd", "dp", "even", "balanced")


def compare_chain(chain, stages: int, memory: float | None, source: str) -> list[dict]:
    plans = {m: planner.PIPELINE_METHODS[m](chain, stages, "1f1b", memory) for m in METHODS}
    exact = plans["dp"].iteration_time_s
    rows = []
    for method, p in plans.items():
        gap = 100.0 * (p.iteration_time_s / exact - 1) if np.isfinite(exact) and np.isfinite(p.iteration_time_s) else None
        rows.append({"source": source, "layers": chain.num_layers, "stages": stages, "memory_limit": memory,
                     "method": method, "status": p.status, "objective": p.iteration_time_s, "gap_percent": gap,
                     "evaluations": p.evaluations, "search_time_s": p.search_time_s,
                     "num_microbatches": p.num_microbatches, "fits_memory": p.fits_memory})
    if plans["csimd"].fits_memory is False and plans["csimd"].status == "OK":
        raise SystemExit(f"CSIMD violated memory on {source}")
    return rows


def random_rows(instances: int, big: list[int]) -> list[dict]:
    rng = np.random.default_rng(2026)
    rows = []
    for k in range(instances):
        layers = int(rng.integers(8, 65))
        stages = int(rng.choice([2, 4, 8]))
        chain = planner.random_chain(k, layers)
        memory = float(chain.static_memory.sum() / stages * 1.5 + 1e9) if k % 2 else None
        rows += compare_chain(chain, stages, memory, "random")
    for layers in big:
        rows += compare_chain(planner.random_chain(layers, layers), 8, None, "random-large")
    return rows


def zoo_rows(models) -> list[dict]:
    rows = []
    for model, mesh, batch, recompute in models:
        settings = planner.TrainingSettings(recompute=recompute, zero=1 if recompute else 0)
        chain = planner.layer_chain(model, mesh, stages=4, batch=batch, settings=settings)[0]
        for row in compare_chain(chain, 4, 80e9, model):
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--big", default="96,200,500,1000", help="layer counts of the large random chains")
    parser.add_argument("--quick", action="store_true", help="100 instances, large chains 96 and 200, two zoo models")
    parser.add_argument("--out", default="results/pipeline.csv")
    args = parser.parse_args(argv)
    models = ZOO
    if args.quick:
        args.instances, args.big, models = 100, "96,200", ZOO[2:3] + ZOO[4:]
    rows = random_rows(args.instances, [int(x) for x in args.big.split(",") if x])
    rows += zoo_rows(models)
    csimd = [r for r in rows if r["method"] == "csimd" and r["source"] == "random" and r["gap_percent"] is not None]
    within = sum(r["gap_percent"] <= 1.0 for r in csimd)
    print(f"CSIMD within 1% of the exact DP on {within}/{len(csimd)} random instances")
    for r in rows:
        if r["source"] != "random":
            print({k: r[k] for k in ("source", "layers", "method", "gap_percent", "evaluations", "search_time_s")})
    write_csv(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
