"""The commands that hand a plan to the engines: import-torch, export and verify (one function per
command, as ``planner.cli.commands``; the training runs are in ``planner.cli.training``)."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

from planner import api3d, runs
from planner.errors import SettingsError
from planner.outputs import write_json
from planner.plan_files import read_plan_file
from planner.cli.report import emit as _emit
from planner.cli.argtypes import EXIT_MISMATCH, EXIT_OK
from planner.cli.recost import checked
from planner.engines.torch.importer import import_module
from planner.engines.torch.presets import build_spec
from planner.ir.graph_json import graph_to_dict
from planner.launch import plan_for
from planner.engines.export import export_plan, jax_file
from planner.engines.torch.module import module_plan
from planner.outputs import write_text
from planner.launch import export_torchtitan
from planner.launch.megatron import PLACEHOLDER_NOTE
from planner.launch import export_megatron
from planner.engines.torch.pipelining import pipelining_plan
from planner.engines.verify import format_report


def cmd_import_torch(args: argparse.Namespace) -> int:

    module, inputs, name = build_spec(args.spec)
    graph = import_module(
        module, inputs, name=name, allow_unknown=args.allow_unknown, loss=args.loss
    )
    torch_params = sum(p.numel() for p in module.parameters())

    write_json(
        args.json, {**graph_to_dict(graph), "torch_module": {"spec": args.spec, "loss": args.loss}}
    )
    _emit(
        f"imported {name}: {len(graph.operators)} operators, {graph.num_params:,d} parameters "
        f"(torch module: {torch_params:,d}), {graph.flops / 1e9:.2f} GFLOPs forward -> {args.json}",
        args,
    )
    return EXIT_OK


def engine_search(args: argparse.Namespace) -> tuple:
    """The whole-cluster search of `plan --pipeline auto` and its stage planner, or with --for the
    search restricted to what that engine runs (``planner.launch.plan_for``)."""
    engine = getattr(args, "engine", None)
    if engine is None:
        return api3d.plan_pipeline, {"intra": args.method}
    if args.method != "exact":
        raise SettingsError(
            f"--method: --for {engine} searches the engine's own stage plans (Megatron-LM's "
            "tensor-parallel pattern at every tensor degree of a node)"
        )

    return functools.partial(plan_for, engine), {}


def cmd_export(args: argparse.Namespace) -> int:
    if args.target in ("megatron", "torchtitan"):
        return _export_launch(args)
    if args.target != "json":
        return _export_file(args)
    for option, value in (("--out", args.out), ("--module", args.module)):
        if value is not None:
            raise SettingsError(
                f"{option}: only with --target torch or jax (--target json writes --json)"
            )
    data = runs.export_shardings(load_checked(args), args.tensor_axis)
    if args.json is not None:
        write_json(args.json, data)
    else:
        _emit(json.dumps(data, indent=1), args)
    return EXIT_OK


def _export_file(args: argparse.Namespace) -> int:
    """A Python plan file for PyTorch (the nn.Module) or JAX."""
    for option, value in (("--json", args.json), ("--tensor-axis", args.tensor_axis)):
        if value is not None:
            raise SettingsError(
                f"{option}: only with --target json (--target {args.target} writes --out)"
            )
    if args.out is None:
        raise SettingsError(
            f"--out: --target {args.target} writes a Python file: name it with --out"
        )
    if args.target == "jax" and args.module is not None:
        raise SettingsError("--module: only with --target torch")
    data = read_plan_file(args.plan)
    if "pipeline" in data and args.target == "torch":
        return _export_pipelining(args, data)
    loaded = load_checked(args)
    title = (
        f"{loaded.graph.name} on {loaded.mesh.spec} ({data.get('method', '?')}, "
        f"{data.get('status', '?')}, {float(data.get('estimated_step_time_s') or 0) * 1e3:.3f} "
        f"ms/step), from {args.plan}"
    )
    if args.target == "jax":
        text = jax_file(
            loaded.graph, export_plan(loaded.graph, loaded.strategies, loaded.mesh), title
        )
    else:
        spec, loss = _torch_module(args, data)
        _check_module(spec, loaded.graph)
        zero = (data.get("settings") or {}).get("zero") or 0
        text = module_plan(
            loaded.graph, loaded.strategies, loaded.mesh, spec, loss, title, zero
        ).render()

    write_text(args.out, text, "--out")
    _emit(f"{args.target} plan of {loaded.graph.name} on {loaded.mesh.spec} -> {args.out}", args)
    return EXIT_OK


def _export_launch(args: argparse.Namespace) -> int:
    """A 3D plan as a Megatron-LM launch line or a torchtitan config file, refused unless the
    configuration costs what the plan does."""
    target = args.target
    for option in ("json", "tensor_axis", "module", "model", "batch", "seq"):
        if getattr(args, option, None) is not None:
            flag = "--" + option.replace("_", "-")
            raise SettingsError(f"{flag}: not with --target {target} (the plan file fixes it)")
    data = read_plan_file(args.plan)
    if "pipeline" not in data:
        raise SettingsError(
            f"--plan: --target {target} needs a 3D plan (planner plan --pipeline auto, or "
            "planner evaluate --tp/--pp/--dp --json)"
        )
    checked(args, data, args.plan)
    if target == "torchtitan":
        return _export_torchtitan(args, data)
    return _export_megatron(args, data)


def _export_torchtitan(args: argparse.Namespace, data: dict) -> int:

    if args.out is None:
        raise SettingsError("--out: --target torchtitan writes a Python config file: name it")
    export = export_torchtitan(data, title=f"{data.get('model')} on {data.get('mesh')}")
    write_text(args.out, export.text, "--out")
    _emit(
        f"torchtitan config of {args.plan}: {export.run.world_size} GPUs, "
        f"{export.recosted.pipeline.iteration_time_s:.4f} s per iteration as given "
        f"({export.gap:+.3%} against the plan) -> {args.out} (--config planner_plan)",
        args,
    )
    return EXIT_OK


def _export_megatron(args: argparse.Namespace, data: dict) -> int:
    """A 3D plan as a Megatron-LM launch line."""
    export = export_megatron(data)
    text = export.line + "\n"
    said = (
        f"# Megatron-LM launch of {args.plan}: {export.run.world_size} GPUs, "
        f"{export.recosted.pipeline.iteration_time_s:.4f} s per iteration as given "
        f"({export.gap:+.3%} against the plan)\n{PLACEHOLDER_NOTE}"
    )
    if args.out is None:
        _emit(said + "\n" + export.line, args)
        return EXIT_OK
    write_text(args.out, said + "\n" + text, "--out")
    _emit(f"{said.splitlines()[0][2:]} -> {args.out}", args)
    return EXIT_OK


def _export_pipelining(args: argparse.Namespace, data: dict) -> int:
    """A 3D plan as torch.distributed.pipelining stages of the imported module."""
    spec, loss = _torch_module(args, data)
    checked(args, data, args.plan)
    pipe, source = data["pipeline"], data.get("source") or {}
    micro = api3d.model_loader(args.model or source.get("model"), args.seq or source.get("seq"))(
        int(pipe["micro_batch"])
    )
    title = (
        f"{pipe['stages']} stages of {pipe['stage_mesh']}, {pipe['num_microbatches']} "
        f"micro-batches, from {args.plan}"
    )
    write_text(args.out, pipelining_plan(data, micro, spec, loss, title), "--out")
    _emit(f"torch pipelining plan of {micro.name}: {title} -> {args.out}", args)
    return EXIT_OK


def _torch_module(args: argparse.Namespace, data: dict) -> tuple[str, str]:
    """The nn.Module spec and loss: --module, or what import-torch recorded in the plan's graph
    JSON."""
    model = args.model or (data.get("source") or {}).get("model")
    recorded = {}
    if isinstance(model, str) and model.endswith(".json") and os.path.exists(model):
        with open(model, encoding="utf-8") as handle:
            recorded = json.load(handle).get("torch_module") or {}
    if args.module is not None:
        return args.module, recorded.get("loss", "sum")
    if not recorded:
        raise SettingsError(
            f"--module: the plan's model {model} was not imported by `planner import-torch`; name "
            "the nn.Module with --module SPEC"
        )
    return recorded["spec"], recorded["loss"]


def _check_module(spec: str, graph) -> None:
    """The nn.Module of ``spec`` must be the plan's model: the same parameter sizes (a plan of a
    hidden-64 GPT-2 onto a hidden-768 one was exported without a word)."""
    module = build_spec(spec)[0]
    sizes = sorted(int(p.numel()) for p in module.parameters())
    planned = sorted(t.numel for t in graph.tensors if t.role == "param")
    if sizes != planned:
        raise SettingsError(
            f"--module: {spec} has {len(sizes)} parameters ({sum(sizes):,d} values), the plan's "
            f"model {graph.name} {len(planned)} ({sum(planned):,d}): another configuration?"
        )


def cmd_verify(args: argparse.Namespace) -> int:

    if args.no_xla and args.no_numpy and not args.torch:
        raise SettingsError(
            "--no-xla: with --no-numpy nothing is left to check (add --torch, or drop one)"
        )
    loaded = load_checked(args)
    report = runs.verify_loaded(
        loaded,
        run_numpy=not args.no_numpy,
        run_xla=not args.no_xla,
        tolerance=args.tolerance,
        devices=args.devices,
        max_memory=args.max_memory,
        run_torch=args.torch,
    )
    _emit(
        f"plan {args.plan}: {loaded.graph.name} on mesh {loaded.mesh.spec}\n"
        f"{format_report(report)}",
        args,
    )
    if not report.ok:
        print("planner: verify: mismatch beyond tolerance", file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


def load_checked(args: argparse.Namespace):
    """The flat plan of ``--plan`` resolved against its model, after its recorded figures were
    checked against the plan re-costed there (an edited or foreign file is refused before any engine
    runs)."""
    data = read_plan_file(args.plan)
    if "pipeline" not in data:
        checked(args, data, args.plan)
    return runs.load_plan(args.plan, args.model, args.batch, args.seq)
