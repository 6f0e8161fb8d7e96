"""The whole-cluster search against the configurations practitioners write, under the planner's own
cost model, in one run: for each case, `plan --pipeline auto` (the 3D search) and every point of a
Megatron-style grid costed as given (`planner evaluate --tp --pp --dp`): tensor parallelism over
the divisors of a node's GPUs, pipeline parallelism over the divisors of the world (at most the
layers), data parallelism the rest, micro-batch 1 or 2, recompute none/selective/full, ZeRO 0, 1
(distributed optimizer), 2 or 3 (FSDP), sequence parallelism with tensor parallelism, 1F1B
(``planner.grid3d``). Prints
and writes, per case, the search's iteration time, status and wall time, the best fitting grid
point and the ratio search / grid (<= 1: the search is not beaten by the grid); and `plan --for
megatron` (the search restricted to what Megatron-LM runs) with its ratio to the same grid costed
as Megatron-LM runs a bf16 line (fp32 main gradients, fused loss), every point of which it may
choose.

Each row also carries the case's lower bound (``planner.pipeline.bound``: no configuration of the
space beats it) and the gaps of the search's plan and of the best grid point above it.

The certified search (``plan --pipeline auto --certify``) runs with ``--add-certified`` (its
status, time and wall time beside the composed search's).

  python benchmarks/threed.py [--cases a,b] [--out results/threed.csv] [--add-bounds]
                              [--add-certified]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

import planner  # noqa: E402
from planner.api3d import model_loader  # noqa: E402
from planner.cost.settings import TrainingSettings  # noqa: E402
from planner.pipeline.bound import compute_bound  # noqa: E402
from experiments.common import results_table, run  # noqa: E402
from planner.errors import SettingsError  # noqa: E402
from planner.grid3d import grid_best, grid_points  # noqa: E402
from planner.launch import plan_for  # noqa: E402

# name: (model, device, mesh, batch, seq, layers)
CASES = {
    "llama3-8b-8": ("llama3-8b", "h100-80g", "gpu=8", 128, 8192, 32),
    "gpt3-13b-32": ("gpt3-13b", "a100-80g", "node=4,gpu=8", 256, 2048, 40),
    "llama3-70b-64": ("llama3-70b", "h100-80g", "node=8,gpu=8", 128, 8192, 80),
    "llama3-8b-64": ("llama3-8b", "h100-80g", "node=8,gpu=8", 512, 8192, 32),
    "gpt3-175b-1024": ("gpt3-175b", "a100-80g", "node=128,gpu=8", 1536, 2048, 96),
    "llama3-405b-8192": ("llama3-405b", "h100-80g", "node=1024,gpu=8", 2048, 8192, 126),
}
GPUS_PER_NODE = 8


def best_grid_point(
    model, device, world, batch, seq, layers, megatron: bool = False
) -> tuple[float, str, int]:
    """The fastest fitting point of ``planner.grid3d``'s grid: (iteration s, its flags, points
    that fit); ``megatron``: as Megatron-LM runs a bf16 line (fp32 main gradients, its fused
    vocabulary-parallel cross-entropy)."""
    engine = {"fp32_grads": True, "loss_kernel": "fused"} if megatron else {}
    points = grid_points(world, GPUS_PER_NODE, layers, batch, **engine)
    best, point, fitting = grid_best(model, device, points, batch, seq)
    if best is None:
        return float("inf"), "", fitting
    return best.pipeline.iteration_time_s, point.flags, fitting


def run_case(name: str) -> dict:
    model, device, mesh, batch, seq, layers = CASES[name]
    start = time.perf_counter()
    searched = planner.plan_pipeline(model, mesh, device, batch=batch, seq=seq)
    search_wall = time.perf_counter() - start
    start = time.perf_counter()
    engine = plan_for("megatron", model, mesh, device, batch=batch, seq=seq)
    engine_wall = time.perf_counter() - start
    world = planner.make_cluster(mesh, device).mesh.num_devices
    start = time.perf_counter()
    grid_time, flags, costed = best_grid_point(model, device, world, batch, seq, layers)
    pipe, s = searched.pipeline, searched.settings
    return {
        "case": name,
        "model": model,
        "mesh": mesh,
        "device": device,
        "batch": batch,
        "search_status": searched.status,
        "search_iteration_s": pipe.iteration_time_s,
        "search_wall_s": search_wall,
        "search_config": f"{pipe.stages} stages x {searched.stage_mesh}, M={pipe.num_microbatches}"
        f", recompute {s.recompute}, zero {s.zero}, sp {s.sequence_parallel}",
        "grid_best_s": grid_time,
        "grid_best_flags": flags,
        "grid_points_fitting": costed,
        "grid_wall_s": time.perf_counter() - start,
        "ratio": pipe.iteration_time_s / grid_time,
        "for_megatron_s": engine.pipeline.iteration_time_s,
        "for_megatron_wall_s": engine_wall,
        **_megatron_grid(model, device, world, batch, seq, layers, engine),
        **bound_columns(name, pipe.iteration_time_s, grid_time),
    }


def bound_columns(name: str, search_s: float, grid_s: float) -> dict:
    """The case's lower bound (no configuration of the space beats it: ``planner.pipeline.bound``)
    and how far above it the search's plan and the best grid point are."""
    model, device, mesh, batch, seq, _ = CASES[name]
    cluster = planner.make_cluster(mesh, device)
    graph = model_loader(model, seq)(batch)
    bound = compute_bound(graph, cluster.mesh.num_devices, cluster.profile, TrainingSettings())
    return {
        "lower_bound_s": bound,
        "search_gap": search_s / bound - 1,
        "grid_gap": grid_s / bound - 1,
    }


def add_bounds(path: str) -> None:
    """Fill the bound columns of the rows of ``path`` (``--add-bounds``: the bound is a function
    of the case alone, so the rows need no re-run)."""
    table = pd.read_csv(path)
    columns = [
        bound_columns(row.case, row.search_iteration_s, row.grid_best_s)
        for row in table.itertuples()
    ]
    for key in ("lower_bound_s", "search_gap", "grid_gap"):
        table[key] = [c[key] for c in columns]
    table.to_csv(path, index=False)


def certified_columns(name: str, search_s: float) -> dict:
    """The certified search of the case (``--certify``: exhaustive over its stated space):
    status, iteration time, wall time, and today's composed search over it (<= 1: never worse)."""
    model, device, mesh, batch, seq, _ = CASES[name]
    start = time.perf_counter()
    plan = planner.plan_pipeline(model, mesh, device, batch=batch, seq=seq, certify=True)
    return {
        "certified_status": plan.status,
        "certified_iteration_s": plan.pipeline.iteration_time_s,
        "certified_wall_s": time.perf_counter() - start,
        "search_over_certified": search_s / plan.pipeline.iteration_time_s,
    }


def add_certified(path: str, names: list[str]) -> None:
    """Fill the certified search's columns of the rows of ``path`` whose case is in ``names``
    (``--add-certified``: runs the certified search alone, beside the committed rows)."""
    table = pd.read_csv(path)
    for index, row in table.iterrows():
        if row["case"] in names:
            found = certified_columns(row["case"], row["search_iteration_s"])
            print(f"{row['case']}: certified {found}", flush=True)
            for key, value in found.items():
                table.loc[index, key] = value
    table.to_csv(path, index=False)


def _megatron_grid(model, device, world, batch, seq, layers, engine) -> dict:
    """The grid as Megatron-LM runs it (fp32 main gradients under bf16 and its fused loss, as
    `plan --for megatron` costs it): its best point and the ratio of the engine's search to it."""
    grid_time, flags, _ = best_grid_point(model, device, world, batch, seq, layers, True)
    return {
        "megatron_grid_best_s": grid_time,
        "megatron_grid_best_flags": flags,
        "for_megatron_ratio": engine.pipeline.iteration_time_s / grid_time,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", default="results/threed.csv")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument(
        "--add-bounds", action="store_true", help="only fill the bound columns of --out's rows"
    )
    parser.add_argument(
        "--add-certified",
        action="store_true",
        help="only run the certified search (--certify) of --cases and fill its columns",
    )
    args = parser.parse_args(argv)
    if args.add_bounds:
        add_bounds(args.out)
        return 0
    if args.add_certified:
        add_certified(args.out, args.cases.split(","))
        return 0
    args.plot = False
    names = args.cases.split(",")
    for name in names:
        if name not in CASES:
            raise SettingsError(f"--cases: unknown case {name!r} (known: {', '.join(CASES)})")
    table = results_table(args, ("case",))
    for name in names:
        if not table.done(case=name):
            row = run_case(name)
            print(
                f"{name}: search {row['search_iteration_s']:.3f} s ({row['search_status']}, "
                f"{row['search_wall_s']:.1f} s wall), grid best {row['grid_best_s']:.3f} s "
                f"({row['grid_best_flags']}), ratio {row['ratio']:.3f}",
                flush=True,
            )
            table.add([row])
    table.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
