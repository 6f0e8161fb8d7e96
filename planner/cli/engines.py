"""The commands that drive the engines: import-torch, export, verify, run-jax, run-torch (one
function per command, as ``planner.cli.commands``)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from planner import api, runs
from planner.errors import SettingsError
from planner.outputs import write_json
from planner.plans import read_plan_file
from planner.cli.report import emit as _emit
from planner.cli.parser import EXIT_MISMATCH, EXIT_OK
from planner.cli.recost import checked


def cmd_import_torch(args: argparse.Namespace) -> int:
    from planner.engines.torch.importer import import_module
    from planner.engines.torch.presets import build_spec
    module, inputs, name = build_spec(args.spec)
    graph = import_module(module, inputs, name=name, allow_unknown=args.allow_unknown, loss=args.loss)
    torch_params = sum(p.numel() for p in module.parameters())
    from planner.ir.graph_json import graph_to_dict
    write_json(args.json, {**graph_to_dict(graph), "torch_module": {"spec": args.spec, "loss": args.loss}})
    _emit(f"imported {name}: {len(graph.operators)} operators, {graph.num_params:,d} parameters "
          f"(torch module: {torch_params:,d}), {graph.flops / 1e9:.2f} GFLOPs forward -> {args.json}", args)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    if args.target != "json":
        return _export_file(args)
    for option, value in (("--out", args.out), ("--module", args.module)):
        if value is not None:
            raise SettingsError(f"{option}: only with --target torch or jax (--target json writes --json)")
    data = runs.export_shardings(_load_checked(args), args.tensor_axis)
    if args.json is not None:
        write_json(args.json, data)
    else:
        _emit(json.dumps(data, indent=1), args)
    return EXIT_OK


def _export_file(args: argparse.Namespace) -> int:
    """A Python plan file for PyTorch (the nn.Module) or JAX."""
    from planner.engines.export import export_plan, jax_file
    from planner.engines.torch.module import module_plan
    for option, value in (("--json", args.json), ("--tensor-axis", args.tensor_axis)):
        if value is not None:
            raise SettingsError(f"{option}: only with --target json (--target {args.target} writes --out)")
    if args.out is None:
        raise SettingsError(f"--out: --target {args.target} writes a Python file: name it with --out")
    if args.target == "jax" and args.module is not None:
        raise SettingsError("--module: only with --target torch")
    data = read_plan_file(args.plan)
    if "pipeline" in data and args.target == "torch":
        return _export_pipelining(args, data)
    loaded = _load_checked(args)
    title = (f"{loaded.graph.name} on {loaded.mesh.spec} ({data.get('method', '?')}, {data.get('status', '?')}, "
             f"{float(data.get('estimated_step_time_s') or 0) * 1e3:.3f} ms/step), from {args.plan}")
    if args.target == "jax":
        text = jax_file(loaded.graph, export_plan(loaded.graph, loaded.strategies, loaded.mesh), title)
    else:
        spec, loss = _torch_module(args, data)
        _check_module(spec, loaded.graph)
        zero = (data.get("settings") or {}).get("zero") or 0
        text = module_plan(loaded.graph, loaded.strategies, loaded.mesh, spec, loss, title, zero).render()
    from planner.outputs import write_text
    write_text(args.out, text, "--out")
    _emit(f"{args.target} plan of {loaded.graph.name} on {loaded.mesh.spec} -> {args.out}", args)
    return EXIT_OK


def _export_pipelining(args: argparse.Namespace, data: dict) -> int:
    """A 3D plan as torch.distributed.pipelining stages of the imported module."""
    from planner.engines.torch.pipelining import pipelining_plan
    from planner.outputs import write_text
    spec, loss = _torch_module(args, data)
    checked(args, data, args.plan)
    pipe, source = data["pipeline"], data.get("source") or {}
    micro = api.model_loader(args.model or source.get("model"), args.seq or source.get("seq"))(int(pipe["micro_batch"]))
    title = f"{pipe['stages']} stages of {pipe['stage_mesh']}, {pipe['num_microbatches']} micro-batches, from {args.plan}"
    write_text(args.out, pipelining_plan(data, micro, spec, loss, title), "--out")
    _emit(f"torch pipelining plan of {micro.name}: {title} -> {args.out}", args)
    return EXIT_OK


def _torch_module(args: argparse.Namespace, data: dict) -> tuple[str, str]:
    """The nn.Module spec and loss: --module, or what import-torch recorded in the plan's graph JSON."""
    model = args.model or (data.get("source") or {}).get("model")
    recorded = {}
    if isinstance(model, str) and model.endswith(".json") and os.path.exists(model):
        with open(model, encoding="utf-8") as handle:
            recorded = json.load(handle).get("torch_module") or {}
    if args.module is not None:
        return args.module, recorded.get("loss", "sum")
    if not recorded:
        raise SettingsError(f"--module: the plan's model {model} was not imported by `planner import-torch`; "
                            "name the nn.Module with --module SPEC")
    return recorded["spec"], recorded["loss"]


def _check_module(spec: str, graph) -> None:
    """The nn.Module of ``spec`` must be the plan's model: the same parameter sizes (a plan of a
    hidden-64 GPT-2 onto a hidden-768 one was exported without a word)."""
    from planner.engines.torch.presets import build_spec
    module = build_spec(spec)[0]
    sizes = sorted(int(p.numel()) for p in module.parameters())
    planned = sorted(t.numel for t in graph.tensors if t.role == "param")
    if sizes != planned:
        raise SettingsError(f"--module: {spec} has {len(sizes)} parameters ({sum(sizes):,d} values), the plan's "
                            f"model {graph.name} {len(planned)} ({sum(planned):,d}): another configuration?")


def cmd_verify(args: argparse.Namespace) -> int:
    from planner.engines.verify import format_report
    if args.no_xla and args.no_numpy and not args.torch:
        raise SettingsError("--no-xla: with --no-numpy nothing is left to check (add --torch, or drop one)")
    loaded = _load_checked(args)
    report = runs.verify_loaded(loaded, run_numpy=not args.no_numpy, run_xla=not args.no_xla, tolerance=args.tolerance,
                               devices=args.devices, max_memory=args.max_memory, run_torch=args.torch)
    _emit(f"plan {args.plan}: {loaded.graph.name} on mesh {loaded.mesh.spec}\n{format_report(report)}", args)
    if not report.ok:
        print("planner: verify: mismatch beyond tolerance", file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


def cmd_run_jax(args: argparse.Namespace) -> int:
    from planner.engines.jax.train import train_3d_on_jax, train_on_jax
    data = read_plan_file(args.plan)
    if "pipeline" in data:
        return _train_3d(args, data, train_3d_on_jax, args.devices, "--devices", "run-jax", "devices")
    return _train(args, train_on_jax, args.devices, "--devices", "run-jax", "xla_comparison", "XLA compiled")


def cmd_run_torch(args: argparse.Namespace) -> int:
    from planner.engines.torch.train import train_on_torch
    if str(args.plan).endswith(".py"):
        return _train_module(args)
    data = read_plan_file(args.plan)
    if "pipeline" in data:
        from planner.engines.torch.train import train_3d_on_torch
        return _train_3d(args, data, train_3d_on_torch, args.nproc, "--nproc", "run-torch", "processes")
    return _train(args, train_on_torch, args.nproc, "--nproc", "run-torch", "counted_comparison", "CommDebugMode counted")


def _train_module(args: argparse.Namespace) -> int:
    """An exported PyTorch plan file (export --target torch) on its nn.Module."""
    from planner.engines.torch.plan_files import load_plan_file
    from planner.engines.torch.train import train_module_plan
    for option in ("model", "batch", "seq"):
        if getattr(args, option) is not None:
            raise SettingsError(f"--{option}: a PyTorch plan file names its module (MODULE); --{option} does not apply")
    if not os.path.isfile(args.plan):
        raise SettingsError(f"--plan: no file {args.plan}")
    plan = load_plan_file(args.plan)
    nproc = math.prod(plan.MESH_SHAPE)
    if args.nproc is not None and args.nproc != nproc:
        raise SettingsError(f"--nproc: the plan's mesh {plan.MESH_SHAPE} has {nproc} devices, not {args.nproc}")
    run = train_module_plan(args.plan, nproc, steps=args.steps, lr=args.lr, seed=args.seed)
    sizes = dict(zip(plan.MESH_DIM_NAMES, plan.MESH_SHAPE))
    from planner.engines.predicted import compare
    rows, _ = compare([], list(run.transfers), {**sizes, "tied": 2})  # tied: a copy on each end stage
    counted = {row.axes: row.compiled for row in rows}
    lines = [f"plan {args.plan}: {plan.MODULE} on {nproc} {run.platform} processes "
             f"({', '.join(f'{k}={v}' for k, v in sizes.items())}), "
             f"{_kind_of(plan)}, "
             f"SGD lr {args.lr:g}",
             f"{'step':>4s} {'loss (mesh)':>16s} {'loss (1 device)':>16s} {'rel diff':>10s}"]
    lines += [f"{k:4d} {a:16.6f} {b:16.6f} {abs(a - b) / max(abs(b), 1e-30):10.2e}"
              for k, (a, b) in enumerate(zip(run.losses, run.reference))]
    lines.append(f"max relative difference {run.max_rel_diff:.2e} (tolerance {args.tolerance:g})")
    if hasattr(plan, "PREDICTED_BYTES"):  # (a pipelining file: one device of each pipeline rank, summed)
        lines.append("bytes sent per device in one step, cost model (the plan's edges) vs CommDebugMode counted "
                     "(the engine's own choices between the exported placements):")
        axes = list(dict.fromkeys([*plan.MESH_DIM_NAMES, *plan.PREDICTED_BYTES]))
        lines += [f"  {axis:12s} {float(plan.PREDICTED_BYTES.get(axis, 0.0)):14,.0f} {counted.get(axis, 0.0):14,.0f}"
                  for axis in axes]
    _emit("\n".join(lines), args)
    if run.max_rel_diff > args.tolerance:
        print("planner: run-torch: losses differ from the one-process run beyond the tolerance", file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


def _kind_of(plan) -> str:
    if hasattr(plan, "SPLIT_POINTS"):
        inside = f", DTensor on {plan.TENSOR_PARALLEL} devices per stage" if getattr(plan, "TENSOR_PARALLEL", 1) > 1 else ""
        chunks = f", {plan.CHUNKS} model chunks per device" if getattr(plan, "CHUNKS", 1) > 1 else ""
        return (f"torch.distributed.pipelining ({plan.SCHEDULE}{chunks}, {plan.NUM_MICROBATCHES} micro-batches per "
                f"replica{inside})")
    if not getattr(plan, "FULLY_SHARD_MODULES", ()):
        return "parallelize_module + DTensor"
    fsdp = "+".join(plan.FULLY_SHARD_DIM_NAMES)
    tensor_parallel = [name for name in plan.MESH_DIM_NAMES if name not in plan.FULLY_SHARD_DIM_NAMES]
    return f"fully_shard (FSDP2) on {fsdp}" + (f" over DTensor on {tensor_parallel[0]}" if tensor_parallel else "")


def _train_3d(args: argparse.Namespace, data: dict, train, count_given: int | None, option: str, command: str,
              what: str) -> int:
    """A 3D plan on an engine: stages on disjoint device groups (torch: point-to-point sends; JAX:
    device_put between sub-meshes), the intra-operator plan inside each stage."""
    source = data.get("source") or {}
    model = args.model or source.get("model")
    if not isinstance(model, str):
        raise SettingsError(f"--plan: {args.plan}: a 3D run rebuilds the model at the micro-batch size: its 'source' "
                            "must name a zoo model or an imported graph JSON (or pass --model)")
    if str(data["pipeline"].get("schedule", "")).startswith("interleaved"):
        raise SettingsError(f"--plan: {command} runs GPipe / 1F1B stages; interleaved chunks are not run yet")
    # the plan as evaluate re-costs it: its cuts, micro-batches and strategies checked on the model
    plan, again = checked(args, data, args.plan)
    pipe = again["pipeline"]
    count, micro_batch = pipe["num_microbatches"], pipe["micro_batch"]
    stage_shape = tuple(int(part.split("=")[1]) for part in pipe["stage_mesh"].split(","))
    nproc = int(pipe["stages"]) * math.prod(stage_shape)
    if count_given is not None and count_given != nproc:
        raise SettingsError(f"{option}: the 3D plan needs {nproc} {what} ({pipe['stages']} stages of "
                            f"{pipe['stage_mesh']}), not {count_given}")
    seq = args.seq or source.get("seq")
    load = api.model_loader(model, seq)  # a graph JSON from import-torch is re-imported at each batch
    full, micro = load(micro_batch * count), load(micro_batch)
    axes = plan.stage_mesh_names
    stage_of = {name: stage for name, _, stage, _ in plan.operators}
    strategies = {name: tuple(strategy) for name, _, _, strategy in plan.operators}
    from planner.engines.verify import check_run_memory
    check_run_memory(full, strategies, api.make_cluster(pipe["stage_mesh"]).mesh, nproc, args.max_memory)
    run = train(full, micro, stage_of, strategies, axes, stage_shape, int(pipe["stages"]), count, steps=args.steps,
                lr=args.lr, seed=args.seed)
    lines = [f"plan {args.plan}: {micro.name}, {pipe['stages']} stages of {pipe['stage_mesh']} on {nproc} {run.platform} "
             f"{what}, {count} micro-batches of {micro_batch} (GPipe order), SGD lr {args.lr:g}",
             f"{'step':>4s} {'loss (mesh)':>16s} {'loss (1 device)':>16s} {'rel diff':>10s}"]
    lines += [f"{k:4d} {a:16.6f} {b:16.6f} {abs(a - b) / max(abs(b), 1e-30):10.2e}"
              for k, (a, b) in enumerate(zip(run.losses, run.reference))]
    lines.append(f"max relative difference {run.max_rel_diff:.2e} (tolerance {args.tolerance:g})")
    if run.transfers:  # torch counts its collectives; the JAX pipeline's are not counted
        lines.append("bytes sent in one step by one device of each stage (summed), cost model vs CommDebugMode:")
        lines += [f"  {c.axes:12s} {c.predicted:14,.0f} {c.compiled:14,.0f} {c.rel_error:8.2%}" for c in
                  run.pipeline_comparison(micro, stage_of, strategies, api.make_cluster(pipe["stage_mesh"]).mesh,
                                          int(pipe["stages"]), count)]
    _emit("\n".join(lines), args)
    if run.max_rel_diff > args.tolerance:
        print(f"planner: {command}: losses differ from the one-process run beyond the tolerance", file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


def _train(args: argparse.Namespace, train, count: int | None, option: str, command: str, compare: str,
           observed: str) -> int:
    """K steps of a flat plan on an engine against one device; the engine's collectives against the cost model."""
    loaded = _load_checked(args)
    if count is not None and count != loaded.mesh.num_devices:
        raise SettingsError(f"{option}: the plan's mesh {loaded.mesh.spec} has {loaded.mesh.num_devices} devices, "
                            f"not {count}")
    from planner.engines.verify import check_run_memory
    check_run_memory(loaded.graph, loaded.strategies, loaded.mesh, loaded.mesh.num_devices, args.max_memory)
    run = train(loaded.graph, loaded.strategies, loaded.mesh.names, loaded.mesh.shape, steps=args.steps, lr=args.lr,
                seed=args.seed)
    lines = [f"plan {args.plan}: {loaded.graph.name} on {run.devices} {run.platform} devices ({loaded.mesh.spec}), "
             f"SGD lr {args.lr:g}", f"{'step':>4s} {'loss (mesh)':>16s} {'loss (1 device)':>16s} {'rel diff':>10s}"]
    for k, (loss, ref) in enumerate(zip(run.losses, run.reference)):
        lines.append(f"{k:4d} {loss:16.6f} {ref:16.6f} {abs(loss - ref) / max(abs(ref), 1e-30):10.2e}")
    lines.append(f"max relative difference {run.max_rel_diff:.2e} (tolerance {args.tolerance:g})")
    lines.append(f"bytes sent per device in one step, cost model vs {observed}:")
    lines += [f"  {c.axes:12s} {c.predicted:14,.0f} {c.compiled:14,.0f} {c.rel_error:8.2%}"
              for c in getattr(run, compare)(loaded.graph, loaded.strategies, loaded.mesh)]
    _emit("\n".join(lines), args)
    if run.max_rel_diff > args.tolerance:
        print(f"planner: {command}: losses differ from the one-device run beyond the tolerance", file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


def _load_checked(args: argparse.Namespace):
    """The flat plan of ``--plan`` resolved against its model, after its recorded figures were checked
    against the plan re-costed there (an edited or foreign file is refused before any engine runs)."""
    data = read_plan_file(args.plan)
    if "pipeline" not in data:
        checked(args, data, args.plan)
    return runs.load_plan(args.plan, args.model, args.batch, args.seq)

