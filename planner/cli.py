"""Command line: ``planner models | plan | compare | pipeline | evaluate | import-torch | export | verify``.

Every option a command accepts is used; an option that cannot apply (a pipeline option without
``--pipeline auto``, ``--mesh`` beside ``--plan`` or ``--tp``) is refused with exit code 2.
Exit codes: 0 a plan was found, 2 bad input (one line on stderr naming the field), 3 infeasible
(or no plan found), 4 a time-limited plan that is not proven optimal under ``--require-optimal``,
5 ``verify`` found a mismatch beyond tolerance, 130 interrupted. Output files are written before
the report is printed, so a closed stdout (``planner ... | head``) loses nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from typing import Sequence

from planner import api
from planner.cost import TrainingSettings
from planner.errors import InfeasibleError, PlannerError, SettingsError
from planner.mesh import DEFAULT_HARDWARE_CSV, SYMBOLIC, parse_mesh
from planner.pipeline import METHODS as PIPELINE_METHODS, SCHEDULES
from planner.plans import Plan
from planner.report import format_3d, format_plan, summary_3d
from planner.signals import exit_code, install_handlers

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


SETTINGS_DEFAULTS = {"dtype": "bf16", "optimizer": "adam", "zero": 0, "recompute": "none"}


def _add_common(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    _add_logging(p, top=False)
    p.add_argument("--model", required=model_required,
                   help="zoo name, parametric spec (gpt:layers=4,hidden=512,heads=8) or graph .json")
    p.add_argument("--mesh", help="mesh spec: 8, 2x4, node=8,gpu=8 (default 8)")
    p.add_argument("--device", help="machine profile: symbolic, a hardware table row, or a .json file (default a100-80g)")
    p.add_argument("--hardware", default=DEFAULT_HARDWARE_CSV,
                   help="datasheet table in the format of planner/data/hardware.csv (default: the built-in table)")
    p.add_argument("--batch", type=_positive_int, help="global batch (zoo default if omitted)")
    p.add_argument("--seq", type=_positive_int, help="sequence length (language models)")
    p.add_argument("--memory", type=_bytes, help="memory limit per device in bytes, or none (default: the device's memory)")
    # None: the default below, or the plan file's own value when one is read back
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="default bf16")
    p.add_argument("--optimizer", choices=["adam", "sgd"], help="default adam")
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], help="ZeRO stage on data-parallel axes (default 0)")
    p.add_argument("--recompute", choices=["none", "full"], help="activation recompute (default none)")
    p.add_argument("--json", help="write the plan as JSON here")
    p.add_argument("--csv", help="write one summary row as CSV here")
    p.add_argument("--no-timings", action="store_true", help="drop search times from JSON and CSV (byte-identical reruns)")


def _add_search(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default="exact", choices=list(api.METHODS),
                   help="intra-operator search (default exact; dp = data parallelism, zero = ZeRO-3)")
    p.add_argument("--time-limit", type=_seconds, default=60.0,
                   help="solver time limit in seconds (default 60; with a pipeline: per stage plan)")
    p.add_argument("--require-optimal", action="store_true",
                   help="exit 4 when the solver stops at its time limit with a FEASIBLE (not proven optimal) plan")
    p.add_argument("--seed", type=_seed, default=0, help="solver seed, 0..2^31-1 (default 0)")
    p.add_argument("--jobs", type=_positive_int, default=1,
                   help="worker processes for distinct segments (default 1; at most the CPU count)")


PIPELINE_OPTIONS = ("schedule", "pp", "num_microbatches", "pipeline_method", "cuts")


def _add_pipeline(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schedule", choices=list(SCHEDULES), help="pipeline schedule (default 1f1b)")
    p.add_argument("--pp", type=_positive_int, help="pipeline degree (default: search every divisor)")
    p.add_argument("--num-microbatches", type=_positive_int, help="micro-batch count (default: search every divisor)")
    p.add_argument("--pipeline-method", choices=list(PIPELINE_METHODS),
                   help="cut search (default csimd; exact = Alpa's dynamic programme)")
    p.add_argument("--cuts", type=_cuts, help="fixed stage cuts: first layer of stages 1..p-1, e.g. 8,16,24 (needs --pp)")


def _cuts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(c) for c in text.split(",") if c.strip()) if text.strip() else ()
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated layer indices, got {text!r}") from None


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 0 <= value < 2**31:
        raise argparse.ArgumentTypeError(f"must be in 0..2^31-1, got {text!r}")
    return value


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
    m = sub.add_parser("models", help="list the model zoo")
    _add_logging(m, top=False)
    p = sub.add_parser("plan", help="search a plan (intra-operator, or 3D with --pipeline auto)")
    _add_common(p)
    _add_search(p)
    p.add_argument("--pipeline", choices=["none", "auto"], default="none",
                   help="auto: search pipeline degree, cuts and micro-batches too (3D plan); default none")
    _add_pipeline(p)
    c = sub.add_parser("compare", help="compare search methods on one model and cluster")
    _add_common(c)
    c.add_argument("--methods", default=",".join(api.METHODS), help="comma-separated methods (default: all)")
    c.add_argument("--time-limit", type=_seconds, default=60.0, help="solver time limit per method (default 60)")
    c.add_argument("--seed", type=_seed, default=0)
    pp = sub.add_parser("pipeline", help="3D plan: pipeline stages with intra-operator plans (= plan --pipeline auto)")
    _add_common(pp)
    _add_search(pp)
    pp.add_argument("--devices", type=_positive_int, help="device count (mesh node=N/8,gpu=8 unless --mesh)")
    _add_pipeline(pp)
    e = sub.add_parser("evaluate", help="cost a given plan: a plan JSON (flat or 3D) or Megatron degrees")
    _add_common(e, model_required=False)
    e.add_argument("--plan", help="plan JSON written by `planner plan --json` (flat or 3D)")
    e.add_argument("--tp", type=_positive_int, help="tensor-parallel degree (Megatron pattern, innermost)")
    e.add_argument("--dp", type=_positive_int, help="data-parallel degree")
    e.add_argument("--pp", type=_positive_int, help="pipeline degree (even layer split unless --cuts)")
    e.add_argument("--micro-batch", type=_positive_int,
                   help="samples per micro-batch and replica (default: batch / dp, one micro-batch)")
    e.add_argument("--schedule", choices=list(SCHEDULES), help="pipeline schedule (default 1f1b)")
    e.add_argument("--cuts", type=_cuts, help="stage cuts: first layer of stages 1..p-1 (default: even split)")
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
    v.add_argument("--max-memory", type=_bytes,
                   help="refuse when the estimated memory of the checks exceeds this (default: half the free memory)")
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


def _settings(args: argparse.Namespace, base: dict | None = None) -> TrainingSettings:
    """Settings from the options; an option not given takes ``base`` (a plan file's) or the default."""
    values = {k: getattr(args, k) if getattr(args, k) is not None else (base or SETTINGS_DEFAULTS).get(k, v)
              for k, v in SETTINGS_DEFAULTS.items()}
    return TrainingSettings(values["dtype"], values["optimizer"], int(values["zero"]), values["recompute"] == "full")


def _given(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n, None) not in (None, False)]


def _refuse(args: argparse.Namespace, names: Sequence[str], why: str) -> None:
    given = _given(args, names)
    if given:
        raise SettingsError(f"{given[0]}: {why}")


def _emit(text: str, args: argparse.Namespace) -> None:
    """Print the report unless --quiet; a closed stdout (``| head``) ends the printing quietly."""
    if args.quiet:
        return
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout at exit


def _source(args: argparse.Namespace) -> dict:
    model = args.model
    if isinstance(model, str) and model.endswith(".json"):
        model = os.path.abspath(model)  # a plan read from another directory still finds its graph
    return {"model": model, "batch": args.batch, "seq": args.seq}


def _status_code(status: str, require_optimal: bool, explanation: str = "") -> int:
    if status in ("OPTIMAL", "HEURISTIC", "GIVEN", "OK"):
        return EXIT_OK
    if status == "FEASIBLE":
        log.warning("the solver stopped at its time limit: the plan is FEASIBLE, not proven optimal "
                    "(raise --time-limit for a proof)")
        if require_optimal:
            print("planner: error: --require-optimal: the plan is FEASIBLE, not proven optimal", file=sys.stderr)
            return EXIT_NOT_OPTIMAL
        return EXIT_OK
    if status == "INFEASIBLE":
        print(f"planner: infeasible: {explanation or 'no plan fits the memory limit'}", file=sys.stderr)
    else:
        print(f"planner: no plan: the search ended {status} ({explanation or 'raise --time-limit'})", file=sys.stderr)
    return EXIT_INFEASIBLE


def _finish(plan: Plan, args: argparse.Namespace) -> int:
    from planner import io
    found = plan.status not in ("INFEASIBLE", "UNKNOWN")
    if args.json is not None and found:  # no plan file for a run that found no plan
        data = plan.to_dict(timings=not args.no_timings)
        data["source"] = _source(args)
        io.write_json(args.json, data)
    if args.csv is not None:
        io.write_csv(args.csv, [plan.summary_row(timings=not args.no_timings)])
    _emit(format_plan(plan), args)
    return _status_code(plan.status, getattr(args, "require_optimal", False), plan.explanation)


def _finish_3d(result, args: argparse.Namespace) -> int:
    from planner import io
    if args.json is not None:
        data = result.to_dict(timings=not args.no_timings)
        data["source"] = _source(args)
        io.write_json(args.json, data)
    if args.csv is not None:
        io.write_csv(args.csv, [summary_3d(result, args.model, timings=not args.no_timings)])
    _emit(format_3d(result), args)
    return _status_code(result.intra_status if result.pipeline.fits_memory else "INFEASIBLE",
                        getattr(args, "require_optimal", False))


def cmd_models(args: argparse.Namespace) -> int:
    from planner.zoo import load_model, model_names
    lines = [f"{'model':20s} {'parameters':>14s} {'operators':>10s} {'GFLOPs/sample':>14s}"]
    for name in model_names():
        graph = load_model(name)
        samples = graph.tensors[0].shape[0]
        lines.append(f"{name:20s} {graph.num_params:14,d} {len(graph.operators):10d} {graph.flops / samples / 1e9:14.2f}")
    _emit("\n".join(lines), args)
    return EXIT_OK


def _jobs(args: argparse.Namespace) -> int:
    cpus = os.cpu_count() or 1
    if args.jobs > cpus:
        log.warning("--jobs %d: capped at the %d CPUs of this machine", args.jobs, cpus)
    return min(args.jobs, cpus)


def cmd_pipeline(args: argparse.Namespace) -> int:
    if args.cuts is not None and args.pp is None:
        raise SettingsError("--cuts: needs --pp (fixed cuts belong to one pipeline degree)")
    mesh = args.mesh or ("8" if args.command == "plan" else None)  # `pipeline` may size it from --devices
    result = api.plan_pipeline(
        args.model, mesh, args.device or "a100-80g", devices=getattr(args, "devices", None), batch=args.batch,
        seq=args.seq, memory=args.memory, settings=_settings(args), schedule=args.schedule or "1f1b",
        method=args.pipeline_method or "csimd", intra=args.method, time_limit_s=args.time_limit, seed=args.seed,
        jobs=_jobs(args), degrees=[args.pp] if args.pp else None,
        counts=[args.num_microbatches] if args.num_microbatches else None, cuts=args.cuts,
        hardware_csv=args.hardware, progress=progress_bar(args))
    return _finish_3d(result, args)


def cmd_plan(args: argparse.Namespace) -> int:
    if args.pipeline == "auto":
        return cmd_pipeline(args)
    _refuse(args, PIPELINE_OPTIONS, "only with --pipeline auto (or `planner pipeline`)")
    plan = api.plan(args.model, args.mesh or "8", args.device or "a100-80g", method=args.method, batch=args.batch,
                    seq=args.seq, memory=args.memory, settings=_settings(args), time_limit_s=args.time_limit,
                    seed=args.seed, hardware_csv=args.hardware, jobs=_jobs(args), progress=progress_bar(args))
    return _finish(plan, args)


DEGREE_OPTIONS = ("tp", "dp", "pp", "micro_batch", "schedule", "cuts")


def cmd_evaluate(args: argparse.Namespace) -> int:
    if args.plan:
        _refuse(args, DEGREE_OPTIONS, "not with --plan (the plan file fixes the configuration)")
        return _evaluate_file(args)
    if args.tp is None and args.dp is None and args.pp is None:
        raise SettingsError("--plan: give a plan JSON (--plan PATH) or Megatron degrees (--tp/--dp/--pp)")
    _refuse(args, ("mesh",), "not with --tp/--dp/--pp (the mesh is pp=P,dp=D,tp=T)")
    if not args.model:
        raise SettingsError("--model: required with --tp/--dp/--pp")
    dp = args.dp or 1
    micro_batch = args.micro_batch
    if micro_batch is None:
        samples = api.resolve_model(args.model, args.batch, args.seq).tensors[0].shape[0]
        if samples % dp:
            raise SettingsError(f"--batch: the global batch {samples} is not divisible by --dp {dp}")
        micro_batch = samples // dp
    result = api.evaluate_3d(args.model, args.device or "a100-80g", tp=args.tp or 1, pp=args.pp or 1, dp=dp,
                             micro_batch=micro_batch, batch=args.batch, seq=args.seq, settings=_settings(args),
                             schedule=args.schedule or "1f1b", memory=args.memory, cuts=args.cuts,
                             hardware_csv=args.hardware, fit_required=False)
    return _finish_3d(result, args)


def _evaluate_file(args: argparse.Namespace) -> int:
    """Re-cost a plan JSON on its own mesh, device, settings and memory limit (options given override)."""
    data = api.read_plan_file(args.plan)
    if args.mesh and parse_mesh(args.mesh, SYMBOLIC).spec != parse_mesh(data["mesh"], SYMBOLIC).spec:
        raise SettingsError(f"--mesh: {args.mesh!r} differs from the plan's mesh {data['mesh']!r}; drop --mesh")
    source = data.get("source") or {}
    args.model = args.model or source.get("model")
    if not args.model:
        raise SettingsError(f"--model: {args.plan} has no 'source' model; pass --model")
    batch, seq = args.batch or source.get("batch"), args.seq or source.get("seq")
    device = args.device or data.get("device") or "a100-80g"
    memory = args.memory if args.memory is not None else (data.get("memory_limit_bytes") or float("inf"))
    settings = _settings(args, data.get("settings"))
    if "pipeline" in data:
        result = api.evaluate_3d_file(data, args.model, device, batch=batch, seq=seq, settings=settings,
                                      memory=memory, hardware_csv=args.hardware, where=f"--plan {args.plan}")
        return _finish_3d(result, args)
    assignment = {o["name"]: o["strategy"] for o in data["operators"]}
    plan = api.evaluate(args.model, data["mesh"], device, assignment=assignment, batch=batch, seq=seq, memory=memory,
                        settings=settings, hardware_csv=args.hardware)
    return _finish(plan, args)


def cmd_compare(args: argparse.Namespace) -> int:
    from planner import io
    rows = api.compare(args.model, args.mesh or "8", args.device or "a100-80g", methods=tuple(args.methods.split(",")),
                       batch=args.batch, seq=args.seq, memory=args.memory, settings=_settings(args),
                       time_limit_s=args.time_limit, seed=args.seed, hardware_csv=args.hardware)
    if args.no_timings:
        rows = [{k: v for k, v in r.items() if k != "search_time_s"} for r in rows]
    if args.csv is not None:
        io.write_csv(args.csv, rows)
    if args.json is not None:
        io.write_json(args.json, {"source": _source(args), "rows": rows})
    lines = [f"{'method':10s} {'status':10s} {'step ms':>10s} {'gap %':>8s} {'mem GiB':>8s} {'fits':>5s} {'search s':>9s}"]
    for r in rows:
        gap = "-" if r["gap_percent"] is None else f"{r['gap_percent']:.2f}"
        search = f"{r['search_time_s']:9.3f}" if "search_time_s" in r else f"{'-':>9s}"
        lines.append(f"{r['method']:10s} {r['status']:10s} {r['estimated_step_time_s'] * 1e3:10.3f} {gap:>8s} "
                     f"{r['memory_per_device_bytes'] / 2**30:8.2f} {str(r['fits_memory']):>5s} {search}")
    _emit("\n".join(lines), args)
    return EXIT_OK


def cmd_import_torch(args: argparse.Namespace) -> int:
    from planner import io
    from planner.torch_import import import_module
    from planner.torch_presets import build_spec
    module, inputs, name = build_spec(args.spec)
    graph = import_module(module, inputs, name=name, allow_unknown=args.allow_unknown)
    torch_params = sum(p.numel() for p in module.parameters())
    io.save_graph(graph, args.json)
    _emit(f"imported {name}: {len(graph.operators)} operators, {graph.num_params:,d} parameters "
          f"(torch module: {torch_params:,d}), {graph.flops / 1e9:.2f} GFLOPs forward -> {args.json}", args)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from planner import io
    data = api.export_shardings(api.load_plan(args.plan, args.model, args.batch, args.seq), args.tensor_axis)
    if args.json is not None:
        io.write_json(args.json, data)
    else:
        _emit(json.dumps(data, indent=1), args)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from planner.verify import format_report
    loaded = api.load_plan(args.plan, args.model, args.batch, args.seq)
    report = api.verify_loaded(loaded, run_numpy=not args.no_numpy, run_xla=not args.no_xla, tolerance=args.tolerance,
                               devices=args.devices, max_memory=args.max_memory)
    _emit(f"plan {args.plan}: {loaded.graph.name} on mesh {loaded.mesh.spec}\n{format_report(report)}", args)
    if not report.ok:
        print("planner: verify: mismatch beyond tolerance", file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


COMMANDS = {"models": cmd_models, "import-torch": cmd_import_torch, "export": cmd_export, "verify": cmd_verify,
            "plan": cmd_plan, "evaluate": cmd_evaluate, "compare": cmd_compare, "pipeline": cmd_pipeline}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * args.verbose if not args.quiet else logging.ERROR
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(levelname)s %(name)s: %(message)s")
    install_handlers()
    try:
        return COMMANDS[args.command](args)
    except InfeasibleError as exc:
        if args.debug:
            raise
        print(f"planner: infeasible: {exc}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except PlannerError as exc:
        if args.debug:
            raise
        print(f"planner: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: nothing half-done is written
        return exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
