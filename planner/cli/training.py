"""The commands that train a plan on an engine against one device: run-jax and run-torch (flat
plans, PyTorch module plans and 3D plans)."""

from __future__ import annotations

import argparse
import math
import os
import sys

from planner import api, api3d
from planner.errors import SettingsError
from planner.cli.report import emit as _emit
from planner.cli.argtypes import EXIT_MISMATCH, EXIT_OK
from planner.cli.engines import load_checked
from planner.cli.recost import checked
from planner.plan_files import read_plan_file
from planner.engines.jax.train import train_3d_on_jax, train_on_jax
from planner.engines.torch.plan_files import load_plan_file
from planner.engines.predicted import compare
from planner.engines.verify import check_run_memory
from planner.engines.torch.train import train_on_torch
from planner.engines.torch.train import train_3d_on_torch
from planner.engines.torch.train import train_module_plan


def cmd_run_jax(args: argparse.Namespace) -> int:

    data = read_plan_file(args.plan)
    if "pipeline" in data:
        return _train_3d(
            args, data, train_3d_on_jax, args.devices, "--devices", "run-jax", "devices"
        )
    return _train(
        args, train_on_jax, args.devices, "--devices", "run-jax", "xla_comparison", "XLA compiled"
    )


def cmd_run_torch(args: argparse.Namespace) -> int:

    if str(args.plan).endswith(".py"):
        return _train_module(args)
    data = read_plan_file(args.plan)
    if "pipeline" in data:
        return _train_3d(
            args, data, train_3d_on_torch, args.nproc, "--nproc", "run-torch", "processes"
        )
    return _train(
        args,
        train_on_torch,
        args.nproc,
        "--nproc",
        "run-torch",
        "counted_comparison",
        "CommDebugMode counted",
    )


def _train_module(args: argparse.Namespace) -> int:
    """An exported PyTorch plan file (export --target torch) on its nn.Module."""
    for option in ("model", "batch", "seq"):
        if getattr(args, option) is not None:
            raise SettingsError(
                f"--{option}: a PyTorch plan file names its module (MODULE); --{option} does not "
                "apply"
            )
    if not os.path.isfile(args.plan):
        raise SettingsError(f"--plan: no file {args.plan}")
    plan = load_plan_file(args.plan)
    nproc = math.prod(plan.MESH_SHAPE)
    if args.nproc is not None and args.nproc != nproc:
        raise SettingsError(
            f"--nproc: the plan's mesh {plan.MESH_SHAPE} has {nproc} devices, not {args.nproc}"
        )
    run = train_module_plan(args.plan, nproc, steps=args.steps, lr=args.lr, seed=args.seed)
    sizes = dict(zip(plan.MESH_DIM_NAMES, plan.MESH_SHAPE))

    # tied: a copy on each end stage
    rows, _ = compare([], list(run.transfers), {**sizes, "tied": 2})
    counted = {row.axes: row.compiled for row in rows}
    lines = [
        f"plan {args.plan}: {plan.MODULE} on {nproc} {run.platform} processes "
        f"({', '.join(f'{k}={v}' for k, v in sizes.items())}), {_kind_of(plan)}, SGD lr "
        f"{args.lr:g}",
        f"{'step':>4s} {'loss (mesh)':>16s} {'loss (1 device)':>16s} {'rel diff':>10s}",
    ]
    lines += _loss_lines(run, args.tolerance)
    # (a pipelining file: one device of each pipeline rank, summed)
    if hasattr(plan, "PREDICTED_BYTES"):
        lines.append(
            "bytes sent per device in one step, cost model (the plan's edges) vs CommDebugMode "
            "counted (the engine's own choices between the exported placements):"
        )
        axes = list(dict.fromkeys([*plan.MESH_DIM_NAMES, *plan.PREDICTED_BYTES]))
        lines += [
            f"  {axis:12s} {float(plan.PREDICTED_BYTES.get(axis, 0.0)):14,.0f} "
            f"{counted.get(axis, 0.0):14,.0f}"
            for axis in axes
        ]
    return _verdict(lines, args, run, "run-torch", "one-process")


def _kind_of(plan) -> str:
    if hasattr(plan, "SPLIT_POINTS"):
        inside = (
            f", DTensor on {plan.TENSOR_PARALLEL} devices per stage"
            if getattr(plan, "TENSOR_PARALLEL", 1) > 1
            else ""
        )
        chunks = (
            f", {plan.CHUNKS} model chunks per device" if getattr(plan, "CHUNKS", 1) > 1 else ""
        )
        return (
            f"torch.distributed.pipelining ({plan.SCHEDULE}{chunks}, {plan.NUM_MICROBATCHES} "
            f"micro-batches per replica{inside})"
        )
    if not getattr(plan, "FULLY_SHARD_MODULES", ()):
        return "parallelize_module + DTensor"
    fsdp = "+".join(plan.FULLY_SHARD_DIM_NAMES)
    tensor_parallel = [
        name for name in plan.MESH_DIM_NAMES if name not in plan.FULLY_SHARD_DIM_NAMES
    ]
    return f"fully_shard (FSDP2) on {fsdp}" + (
        f" over DTensor on {tensor_parallel[0]}" if tensor_parallel else ""
    )


def _train_3d(
    args: argparse.Namespace,
    data: dict,
    train,
    count_given: int | None,
    option: str,
    command: str,
    what: str,
) -> int:
    """A 3D plan on an engine: stages on disjoint device groups (torch: point-to-point sends; JAX:
    device_put between sub-meshes), the intra-operator plan inside each stage."""
    model = _3d_model(args, data, command)
    # the plan as evaluate re-costs it: its cuts, micro-batches and strategies checked on the model
    plan, again = checked(args, data, args.plan)
    pipe = again["pipeline"]
    count, micro_batch = pipe["num_microbatches"], pipe["micro_batch"]
    stage_shape, nproc = _3d_processes(pipe, count_given, option, what)
    # a graph JSON from import-torch is re-imported at each batch
    load = api3d.model_loader(model, args.seq or (data.get("source") or {}).get("seq"))
    full, micro = load(micro_batch * count), load(micro_batch)
    axes = plan.stage_mesh_names
    stage_of = {name: stage for name, _, stage, _ in plan.operators}
    strategies = {name: tuple(strategy) for name, _, _, strategy in plan.operators}

    mesh = api.make_cluster(pipe["stage_mesh"]).mesh
    check_run_memory(full, strategies, mesh, nproc, args.max_memory)
    stages = int(pipe["stages"])
    layout = (stage_of, strategies, axes, stage_shape, stages, count)  # the runner's arguments
    run = train(full, micro, *layout, steps=args.steps, lr=args.lr, seed=args.seed)
    lines = _report_3d(args, run, micro, pipe, nproc, what)
    if run.transfers:  # torch counts its collectives; the JAX pipeline's are not counted
        comparison = run.pipeline_comparison(micro, stage_of, strategies, mesh, stages, count)
        lines.append(
            "bytes sent in one step by one device of each stage (summed), cost model vs "
            "CommDebugMode:"
        )
        lines += [
            f"  {c.axes:12s} {c.predicted:14,.0f} {c.compiled:14,.0f} {c.rel_error:8.2%}"
            for c in comparison
        ]
    return _verdict(lines, args, run, command, "one-process")


def _3d_processes(pipe: dict, count_given: int | None, option: str, what: str) -> tuple:
    """The stage mesh's shape and the process count a 3D plan needs (the one given must match)."""
    stage_shape = tuple(int(part.split("=")[1]) for part in pipe["stage_mesh"].split(","))
    nproc = int(pipe["stages"]) * math.prod(stage_shape)
    if count_given is not None and count_given != nproc:
        raise SettingsError(
            f"{option}: the 3D plan needs {nproc} {what} ({pipe['stages']} stages of "
            f"{pipe['stage_mesh']}), not {count_given}"
        )
    return stage_shape, nproc


def _3d_model(args: argparse.Namespace, data: dict, command: str) -> str:
    """The model a 3D run rebuilds at the micro-batch size (the plan's source, or --model)."""
    model = args.model or (data.get("source") or {}).get("model")
    if not isinstance(model, str):
        raise SettingsError(
            f"--plan: {args.plan}: a 3D run rebuilds the model at the micro-batch size: its "
            "'source' must name a zoo model or an imported graph JSON (or pass --model)"
        )
    if str(data["pipeline"].get("schedule", "")).startswith("interleaved"):
        raise SettingsError(
            f"--plan: {command} runs GPipe / 1F1B stages; interleaved chunks are not run yet"
        )
    return model


def _report_3d(args: argparse.Namespace, run, micro, pipe: dict, nproc: int, what: str) -> list:
    """The losses of a 3D run beside the one-device run's, step by step."""
    count, micro_batch = pipe["num_microbatches"], pipe["micro_batch"]
    lines = [
        f"plan {args.plan}: {micro.name}, {pipe['stages']} stages of {pipe['stage_mesh']} on "
        f"{nproc} {run.platform} {what}, {count} micro-batches of {micro_batch} (GPipe order), "
        f"SGD lr {args.lr:g}",
        f"{'step':>4s} {'loss (mesh)':>16s} {'loss (1 device)':>16s} {'rel diff':>10s}",
    ]
    lines += _loss_lines(run, args.tolerance)
    return lines


def _train(
    args: argparse.Namespace,
    train,
    count: int | None,
    option: str,
    command: str,
    compare: str,
    observed: str,
) -> int:
    """K steps of a flat plan on an engine against one device; the engine's collectives against the
    cost model."""
    loaded = load_checked(args)
    if count is not None and count != loaded.mesh.num_devices:
        raise SettingsError(
            f"{option}: the plan's mesh {loaded.mesh.spec} has {loaded.mesh.num_devices} devices, "
            f"not {count}"
        )

    check_run_memory(
        loaded.graph, loaded.strategies, loaded.mesh, loaded.mesh.num_devices, args.max_memory
    )
    run = train(
        loaded.graph,
        loaded.strategies,
        loaded.mesh.names,
        loaded.mesh.shape,
        steps=args.steps,
        lr=args.lr,
        seed=args.seed,
    )
    lines = [
        f"plan {args.plan}: {loaded.graph.name} on {run.devices} {run.platform} devices "
        f"({loaded.mesh.spec}), SGD lr {args.lr:g}",
        f"{'step':>4s} {'loss (mesh)':>16s} {'loss (1 device)':>16s} {'rel diff':>10s}",
    ]
    lines += _loss_lines(run, args.tolerance)
    lines.append(f"bytes sent per device in one step, cost model vs {observed}:")
    lines += [
        f"  {c.axes:12s} {c.predicted:14,.0f} {c.compiled:14,.0f} {c.rel_error:8.2%}"
        for c in getattr(run, compare)(loaded.graph, loaded.strategies, loaded.mesh)
    ]
    return _verdict(lines, args, run, command, "one-device")


def _loss_lines(run, tolerance: float) -> list[str]:
    """Each step's loss on the mesh beside the one-device run's, and the largest difference."""
    lines = [
        f"{k:4d} {a:16.6f} {b:16.6f} {abs(a - b) / max(abs(b), 1e-30):10.2e}"
        for k, (a, b) in enumerate(zip(run.losses, run.reference))
    ]
    lines.append(f"max relative difference {run.max_rel_diff:.2e} (tolerance {tolerance:g})")
    return lines


def _verdict(lines: list[str], args: argparse.Namespace, run, command: str, versus: str) -> int:
    """The report printed; exit 5 when the losses differ from the reference run beyond the
    tolerance."""
    _emit("\n".join(lines), args)
    if run.max_rel_diff > args.tolerance:
        print(
            f"planner: {command}: losses differ from the {versus} run beyond the tolerance",
            file=sys.stderr,
        )
        return EXIT_MISMATCH
    return EXIT_OK
