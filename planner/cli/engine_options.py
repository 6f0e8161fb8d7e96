"""The options of the commands that drive the engines: export, verify, show, run-jax and
run-torch."""

from __future__ import annotations

import argparse

from planner.cli.argtypes import (
    add_logging,
    add_picture,
    add_plan_source,
    byte_size,
    number,
    positive_int,
    seed,
    tolerance,
)


def add_export(x: argparse.ArgumentParser) -> None:
    add_plan_source(x)
    x.add_argument(
        "--target",
        choices=["json", "torch", "jax", "megatron", "torchtitan"],
        default="json",
        help="json (default): PartitionSpecs, placements and a Linear plan; torch: a Python file "
        "with a parallelize_module plan and DTensor placements for the nn.Module (then planner "
        "run-torch --plan FILE); jax: a Python file with the PartitionSpecs and a shardings(mesh) "
        "function; megatron: the Megatron-LM launch line of a 3D plan (torchrun pretrain_gpt.py "
        "and its arguments), checked by costing the line as given; torchtitan: a torchtitan 0.3 "
        "config_registry file (--module FILE --config planner_plan) of a 3D plan of a LLaMA 3 "
        "model, checked the same way",
    )
    x.add_argument(
        "--out",
        help="the file to write: the Python file (--target torch, jax or torchtitan), the launch "
        "line (--target megatron; default: print)",
    )
    x.add_argument(
        "--module",
        help="--target torch: the nn.Module's import-torch spec (default: the one `planner "
        "import-torch` recorded in the plan's graph JSON)",
    )
    x.add_argument(
        "--tensor-axis",
        help="--target json: mesh axis of the Linear parallelize plan (default: the innermost)",
    )
    x.add_argument("--json", help="--target json: write the shardings here (default: print)")


def add_verify(v: argparse.ArgumentParser) -> None:
    add_plan_source(v)
    v.add_argument(
        "--devices", type=positive_int, help="emulated devices (must equal the plan's mesh size)"
    )
    v.add_argument(
        "--tolerance",
        type=tolerance,
        default=0.05,
        help="relative tolerance on bytes (default 0.05)",
    )
    v.add_argument("--no-xla", action="store_true", help="skip the XLA compilation (no JAX needed)")
    v.add_argument("--no-numpy", action="store_true", help="skip the numpy executor")
    v.add_argument(
        "--torch",
        action="store_true",
        help="also train one step on gloo processes (planner run-torch) and compare the "
        "collectives CommDebugMode counts with the cost model",
    )
    v.add_argument(
        "--max-memory",
        type=byte_size,
        help="refuse when the estimated memory of the checks exceeds this (default: half the free "
        "memory)",
    )


def add_runs(sub) -> None:
    add_run(
        sub.add_parser(
            "run-jax",
            help="train a plan K steps on a JAX device mesh (emulated CPU devices) against one "
            "device",
        ),
        "--devices",
        "devices",
    )
    add_run(
        sub.add_parser(
            "run-torch",
            help="train a plan (flat or 3D) K steps on torchrun processes (gloo on CPU), every "
            "layout a DTensor placement, against one process",
        ),
        "--nproc",
        "processes",
    )


def add_run(r: argparse.ArgumentParser, count: str, what: str) -> None:
    add_plan_source(r)
    r.add_argument("--steps", type=positive_int, default=5, help="SGD steps (default 5)")
    r.add_argument(
        "--lr",
        type=number(float, lambda v: 0 < v < 1, "a learning rate in (0, 1)"),
        default=1e-4,
        help="SGD learning rate on the summed loss (default 1e-4)",
    )
    r.add_argument(
        "--seed", type=seed, default=0, help="seed of the initial weights and the batch (default 0)"
    )
    r.add_argument(
        "--tolerance",
        type=tolerance,
        default=1e-4,
        help="largest relative loss difference to the one-device run (default 1e-4; exit 5 beyond)",
    )
    r.add_argument(count, type=positive_int, help=f"{what} (must equal the plan's mesh size)")
    r.add_argument(
        "--max-memory",
        type=byte_size,
        help="refuse when the estimated memory of the run exceeds this (default: half the free "
        "memory)",
    )


def add_show(w: argparse.ArgumentParser) -> None:
    add_logging(w, top=False)
    w.add_argument(
        "--plan", required=True, help="plan JSON written by `planner plan --json` (flat or 3D)"
    )
    w.add_argument(
        "--what",
        choices=["schedule", "memory", "sharding", "all"],
        default="all",
        help="which picture (default all, one panel each)",
    )
    add_picture(w, "draw the plan")
    w.add_argument(
        "--text",
        action="store_true",
        help="print the same content as tables (the default without --png/--svg)",
    )
