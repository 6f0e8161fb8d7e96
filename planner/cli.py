"""Command line: ``planner models | plan | evaluate``.

Exit codes: 0 a plan was found, 2 bad input (one line on stderr naming the field), 3 infeasible,
4 a time-limited plan that is not proven optimal under ``--require-optimal``, 5 ``verify`` found
a mismatch beyond tolerance.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections import Counter
from typing import Sequence

from planner import api
from planner.cost import TrainingSettings
from planner.errors import PlannerError, SettingsError
from planner.mesh import DEFAULT_HARDWARE_CSV
from planner.plans import Plan

EXIT_OK, EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_NOT_OPTIMAL, EXIT_MISMATCH = 0, 2, 3, 4, 5
log = logging.getLogger("planner")


def _bytes(text: str) -> float:
    if text.strip().lower() in ("none", "inf", "unlimited"):
        return float("inf")
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([KMGT]i?B?|B)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"cannot parse byte size {text!r} (e.g. 80e9, 40GiB, 16GB)")
    value = float(match.group(1))
    unit = (match.group(2) or "B").rstrip("B") or ""
    scale = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[unit]
    return value * scale


def _add_logging(p: argparse.ArgumentParser, top: bool) -> None:
    # Accepted before or after the command; the command's copy only overrides when given.
    default = (lambda value: value) if top else (lambda value: argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="count", default=default(0), help="more log lines (-vv: debug)")
    p.add_argument("-q", "--quiet", action="store_true", default=default(False), help="errors only; no plan text")
    p.add_argument("--debug", action="store_true", default=default(False), help="show tracebacks")


def _add_common(p: argparse.ArgumentParser) -> None:
    _add_logging(p, top=False)
    p.add_argument("--model", required=True, help="zoo name, parametric spec (gpt:layers=4,hidden=512,heads=8) or graph .json")
    p.add_argument("--mesh", default="8", help="mesh spec: 8, 2x4, node=8,gpu=8 (default 8)")
    p.add_argument("--device", default="a100-80g", help="machine profile: symbolic, a hardware.csv row, or a .json file")
    p.add_argument("--hardware", default=str(DEFAULT_HARDWARE_CSV), help="datasheet table (default: ../shared/reference/hardware.csv)")
    p.add_argument("--batch", type=_positive_int, help="global batch (zoo default if omitted)")
    p.add_argument("--seq", type=_positive_int, help="sequence length (language models)")
    p.add_argument("--memory", type=_bytes, help="memory limit per device in bytes, or none (default: the device's memory)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    p.add_argument("--recompute", default="none", choices=["none", "full"])
    p.add_argument("--json", help="write the plan as JSON here")
    p.add_argument("--csv", help="write one summary row as CSV here")
    p.add_argument("--no-timings", action="store_true", help="drop search times from the JSON (byte-identical reruns)")


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line naming the option, exit code 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number of seconds, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="planner", description="Exact, profiling-free parallelisation planner.")
    _add_logging(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("models", help="list the model zoo")
    p = sub.add_parser("plan", help="search a plan")
    _add_common(p)
    p.add_argument("--method", default="exact", choices=list(api.METHODS))
    p.add_argument("--time-limit", type=_seconds, default=60.0, help="solver time limit in seconds (default 60)")
    p.add_argument("--require-optimal", action="store_true",
                   help="exit 4 when the solver stops at its time limit with a FEASIBLE (not proven optimal) plan")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=_positive_int, default=1, help="worker processes for distinct segments (default 1)")
    p.add_argument("--pipeline", choices=["none", "auto"], default="none",
                   help="auto: search pipeline degree and micro-batches too (3D plan, `planner pipeline`)")
    c = sub.add_parser("compare", help="compare search methods on one model and cluster")
    _add_common(c)
    c.add_argument("--methods", default=",".join(api.METHODS), help="comma-separated methods (default: all)")
    c.add_argument("--time-limit", type=_seconds, default=60.0)
    c.add_argument("--seed", type=int, default=0)
    pp = sub.add_parser("pipeline", help="3D plan: pipeline stages (CSIMD) with exact intra-operator plans")
    _add_common(pp)
    pp.set_defaults(mesh=None)
    pp.add_argument("--devices", type=_positive_int, help="device count (mesh node=N/8,gpu=8 unless --mesh)")
    pp.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b"])
    pp.add_argument("--method", default="csimd", choices=["csimd", "dp", "brute", "even", "balanced"])
    e = sub.add_parser("evaluate", help="cost a given plan (plan JSON or Megatron degrees)")
    _add_common(e)
    e.add_argument("--plan", help="plan JSON whose 'operators' give the strategies")
    e.add_argument("--tp", type=_positive_int, help="tensor-parallel degree (Megatron pattern)")
    e.add_argument("--dp", type=_positive_int, help="data-parallel degree")
    e.add_argument("--pp", type=_positive_int, default=1, help="pipeline degree (1 here; see `planner pipeline`)")
    e.add_argument("--micro-batch", type=_positive_int, help="micro-batch size (must equal the per-replica batch when pp=1)")
    i = sub.add_parser("import-torch", help="import an nn.Module through torch.export into a graph JSON")
    _add_logging(i, top=False)
    i.add_argument("spec", help="hf:gpt2[:layers=12,seq=1024,batch=1], hf:resnet50[:batch=8] or file.py:function "
                                "(returning (module, example_inputs))")
    i.add_argument("--json", required=True, help="graph JSON to write (then: planner plan --model it)")
    i.add_argument("--allow-unknown", action="store_true", help="map unsupported ops to replicated opaque operators")
    x = sub.add_parser("export", help="JAX PartitionSpecs, DTensor placements and a Linear plan of a plan JSON")
    _add_plan_source(x)
    x.add_argument("--tensor-axis", help="mesh axis of the Linear parallelize plan (default: the innermost)")
    x.add_argument("--json", help="write the shardings here (default: print)")
    v = sub.add_parser("verify", help="check a plan: numpy executor vs unsharded, XLA collectives vs the cost model")
    _add_plan_source(v)
    v.add_argument("--devices", type=_positive_int, help="emulated devices (must equal the plan's mesh size)")
    v.add_argument("--tolerance", type=float, default=0.05, help="relative tolerance on bytes (default 0.05)")
    v.add_argument("--no-xla", action="store_true", help="skip the XLA compilation (no JAX needed)")
    v.add_argument("--no-numpy", action="store_true", help="skip the numpy executor")
    return parser


def _add_plan_source(p: argparse.ArgumentParser) -> None:
    _add_logging(p, top=False)
    p.add_argument("--plan", required=True, help="plan JSON written by `planner plan --json`")
    p.add_argument("--model", help="model of the plan (default: the plan's 'source')")
    p.add_argument("--batch", type=_positive_int, help="global batch (default: the plan's 'source')")
    p.add_argument("--seq", type=_positive_int, help="sequence length (default: the plan's 'source')")


def progress_bar(args: argparse.Namespace):
    """A one-line progress bar on stderr, only when stderr is a terminal and not --quiet."""
    if args.quiet or not sys.stderr.isatty():
        return None

    def report(done: int, total: int, label: str) -> None:
        width = 30
        filled = int(width * done / max(1, total))
        end = "\n" if done >= total else ""
        print(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end=end, file=sys.stderr, flush=True)
    return report


def _settings(args: argparse.Namespace) -> TrainingSettings:
    return TrainingSettings(args.dtype, args.optimizer, args.zero, args.recompute == "full")


def _group(name: str) -> str:
    return re.sub(r"(?<=[a-z])\d+(?=\.)", "*", name)


def format_plan(plan: Plan) -> str:
    gib = 2**30
    lines = [f"model {plan.model} on mesh {plan.mesh} ({plan.device}), method {plan.method}: {plan.status}",
             f"estimated step time {plan.estimated_step_time_s * 1e3:.3f} ms "
             f"(compute {plan.compute_s * 1e3:.3f} ms, communication {plan.comm_s * 1e3:.3f} ms); "
             f"objective {plan.objective} x {plan.unit_s:g} s"]
    if plan.comm_by_kind_s:
        lines.append("communication: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in plan.comm_by_kind_s if v))
    mem = ", ".join(f"{k} {v / gib:.2f}" for k, v in plan.memory_breakdown)
    limit = f" of {plan.memory_limit_bytes / gib:.2f} GiB" if plan.memory_limit_bytes else ""
    lines.append(f"memory per device {plan.memory_per_device_bytes / gib:.2f} GiB{limit} ({mem} GiB)")
    lines.append(f"search time {plan.search_time_s:.2f} s")
    for note in plan.notes:
        lines.append(f"note: {note}")
    if plan.explanation:
        lines.append(f"why: {plan.explanation}")
    groups: dict[str, Counter] = {}
    for a in plan.operators:
        text = ",".join(f"{axis}:{dim or '-'}" for axis, dim in a.strategy)
        groups.setdefault(_group(a.name), Counter())[text] += 1
    lines.append("strategies (mesh axis: split dim, '-' replicated):")
    for group, counts in groups.items():
        lines.append(f"  {group:32s} " + "; ".join(f"{s}" + (f" x{n}" if n > 1 else "") for s, n in counts.most_common()))
    return "\n".join(lines)


def _write_outputs(plan: Plan, args: argparse.Namespace) -> None:
    from planner import io
    if args.json:
        data = plan.to_dict(timings=not args.no_timings)
        data["source"] = {"model": args.model, "batch": args.batch, "seq": args.seq}
        io.write_json(args.json, data)
    if args.csv:
        io.write_csv(args.csv, [plan.summary_row(timings=not args.no_timings)])


def _finish(plan: Plan, args: argparse.Namespace) -> int:
    if not args.quiet:
        print(format_plan(plan))
    _write_outputs(plan, args)
    if plan.status == "INFEASIBLE":
        print(f"planner: infeasible: {plan.explanation}", file=sys.stderr)
        return EXIT_INFEASIBLE
    if plan.status == "UNKNOWN":
        print("planner: the solver found no plan within the time limit; raise --time-limit", file=sys.stderr)
        return EXIT_INFEASIBLE
    if plan.status == "FEASIBLE":
        log.warning("the solver stopped at its time limit: the plan is FEASIBLE, not proven optimal "
                    "(raise --time-limit for a proof)")
        if getattr(args, "require_optimal", False):
            print("planner: error: --require-optimal: the plan is FEASIBLE, not proven optimal", file=sys.stderr)
            return EXIT_NOT_OPTIMAL
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    from planner.zoo import load_model, model_names
    print(f"{'model':20s} {'parameters':>14s} {'operators':>10s} {'GFLOPs/sample':>14s}")
    for name in model_names():
        graph = load_model(name)
        samples = graph.tensors[0].shape[0]
        print(f"{name:20s} {graph.num_params:14,d} {len(graph.operators):10d} {graph.flops / samples / 1e9:14.2f}")
    return EXIT_OK


def format_3d(result) -> str:
    pipe = result.pipeline
    gib = 2**30
    lines = [f"3D plan: {pipe.stages} pipeline stages of mesh {result.stage_mesh}, {pipe.num_microbatches} micro-batches "
             f"of {pipe.micro_batch} ({pipe.schedule}, {pipe.method}); intra-operator plan {result.intra_status}",
             f"estimated iteration time {pipe.iteration_time_s:.3f} s (bottleneck stage {pipe.bottleneck_s * 1e3:.2f} ms); "
             f"max memory per device {pipe.max_memory_bytes / gib:.2f} GiB ({'fits' if pipe.fits_memory else 'does not fit'})",
             f"stage cuts (first layer of stages 1..p-1): {list(pipe.cuts)}",
             f"settings: recompute {'full' if result.settings.recompute else 'none'}, zero {result.settings.zero}; "
             "linear layers split: " + ", ".join(f"{a}:{d or '-'}" for a, d in result.tensor_parallel_dims),
             f"search time {result.search_time_s:.2f} s", "candidates (stages, stage mesh, recompute, zero, M, s, GiB, fits):"]
    for c in result.candidates:
        lines.append(f"  {c['stages']:4d} {c['stage_mesh']:18s} {str(c['recompute']):5s} {c['zero']} "
                     f"{c['num_microbatches']:5d} {c['iteration_time_s']:10.3f} {c['max_memory_bytes'] / gib:8.2f} {c['fits_memory']}")
    return "\n".join(lines)


def cmd_pipeline(args: argparse.Namespace) -> int:
    from planner import io
    result = api.plan_pipeline(args.model, args.mesh, args.device, devices=getattr(args, "devices", None),
                               batch=args.batch, seq=args.seq, memory=args.memory, settings=_settings(args),
                               schedule=getattr(args, "schedule", "1f1b"),
                               method=args.method if args.command == "pipeline" else "csimd", hardware_csv=args.hardware,
                               progress=progress_bar(args))
    if not args.quiet:
        print(format_3d(result))
    if args.csv:
        pipe = result.pipeline
        io.write_csv(args.csv, [{"model": args.model, "stages": pipe.stages, "stage_mesh": result.stage_mesh,
                                 "num_microbatches": pipe.num_microbatches, "micro_batch": pipe.micro_batch,
                                 "schedule": pipe.schedule, "method": pipe.method, "status": pipe.status,
                                 "iteration_time_s": pipe.iteration_time_s, "max_memory_bytes": pipe.max_memory_bytes,
                                 "fits_memory": pipe.fits_memory, "cuts": " ".join(map(str, pipe.cuts)),
                                 "recompute": result.settings.recompute, "zero": result.settings.zero,
                                 "search_time_s": result.search_time_s}])
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    if args.pipeline == "auto":
        return cmd_pipeline(args)
    plan = api.plan(args.model, args.mesh, args.device, method=args.method, batch=args.batch, seq=args.seq,
                    memory=args.memory, settings=_settings(args), time_limit_s=args.time_limit, seed=args.seed,
                    hardware_csv=args.hardware, jobs=args.jobs, progress=progress_bar(args))
    return _finish(plan, args)


def cmd_evaluate(args: argparse.Namespace) -> int:
    assignment = None
    if args.plan:
        try:
            with open(args.plan) as handle:
                data = json.load(handle)
            assignment = {o["name"]: o["strategy"] for o in data["operators"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SettingsError(f"--plan: cannot read operators from {args.plan} ({exc})") from None
    elif args.tp is None and args.dp is None:
        raise SettingsError("evaluate: give --plan PATH or --tp/--dp degrees")
    if args.micro_batch is not None and args.pp == 1 and args.batch and args.micro_batch * (args.dp or 1) != args.batch:
        raise SettingsError("--micro-batch: with --pp 1 it must equal the per-replica batch (batch / dp)")
    plan = api.evaluate(args.model, args.mesh if args.plan else None, args.device, assignment=assignment,
                        tp=args.tp, dp=args.dp, pp=args.pp, batch=args.batch, seq=args.seq, memory=args.memory,
                        settings=_settings(args), hardware_csv=args.hardware)
    return _finish(plan, args)


def cmd_compare(args: argparse.Namespace) -> int:
    from planner import io
    rows = api.compare(args.model, args.mesh, args.device, methods=tuple(args.methods.split(",")), batch=args.batch,
                       seq=args.seq, memory=args.memory, settings=_settings(args), time_limit_s=args.time_limit,
                       seed=args.seed, hardware_csv=args.hardware)
    if not args.quiet:
        print(f"{'method':10s} {'status':10s} {'step ms':>10s} {'gap %':>8s} {'mem GiB':>8s} {'fits':>5s} {'search s':>9s}")
        for r in rows:
            gap = "-" if r["gap_percent"] is None else f"{r['gap_percent']:.2f}"
            print(f"{r['method']:10s} {r['status']:10s} {r['estimated_step_time_s'] * 1e3:10.3f} {gap:>8s} "
                  f"{r['memory_per_device_bytes'] / 2**30:8.2f} {str(r['fits_memory']):>5s} {r['search_time_s']:9.3f}")
    if args.csv:
        io.write_csv(args.csv, rows)
    return EXIT_OK


def cmd_import_torch(args: argparse.Namespace) -> int:
    from planner import io
    from planner.torch_import import import_module
    from planner.torch_presets import build_spec
    module, inputs, name = build_spec(args.spec)
    graph = import_module(module, inputs, name=name, allow_unknown=args.allow_unknown)
    torch_params = sum(p.numel() for p in module.parameters())
    io.save_graph(graph, args.json)
    if not args.quiet:
        print(f"imported {name}: {len(graph.operators)} operators, {graph.num_params:,d} parameters "
              f"(torch module: {torch_params:,d}), {graph.flops / 1e9:.2f} GFLOPs forward -> {args.json}")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from planner import io
    data = api.export_shardings(api.load_plan(args.plan, args.model, args.batch, args.seq), args.tensor_axis)
    if args.json:
        io.write_json(args.json, data)
    elif not args.quiet:
        print(json.dumps(data, indent=1))
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from planner.verify import format_report
    loaded = api.load_plan(args.plan, args.model, args.batch, args.seq)
    report = api.verify_loaded(loaded, run_numpy=not args.no_numpy, run_xla=not args.no_xla, tolerance=args.tolerance,
                        devices=args.devices)
    if not args.quiet:
        print(f"plan {args.plan}: {loaded.graph.name} on mesh {loaded.mesh.spec}")
        print(format_report(report))
    if not report.ok:
        print("planner: verify: mismatch beyond tolerance", file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


COMMANDS = {"models": cmd_models, "import-torch": cmd_import_torch, "export": cmd_export, "verify": cmd_verify, "plan": cmd_plan, "evaluate": cmd_evaluate, "compare": cmd_compare,
            "pipeline": cmd_pipeline}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * args.verbose if not args.quiet else logging.ERROR
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[args.command](args)
    except PlannerError as exc:
        if args.debug:
            raise
        print(f"planner: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("planner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
