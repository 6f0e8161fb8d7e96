"""One function per command (``cmd_<name>``): check the options that cannot apply, call the API,
write the outputs, print the report, return the exit code."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from planner import accumulation, api, api3d
from planner.errors import SettingsError
from planner.cluster.mesh import parse_mesh
from planner.cluster.profiles import SYMBOLIC
from planner.jsonfile import read_text
from planner.outputs import write_csv, write_json
from planner.plan_files import read_plan_file
from planner.plans import Plan
from planner.cli.recost import checked, recost, settings_from_args as _settings
from planner.cli.engines import cmd_export, cmd_import_torch, cmd_verify, engine_search
from planner.cli.front import cmd_pareto, cmd_top_k
from planner.cli.training import cmd_run_jax, cmd_run_torch
from planner.cli.report import check_picture, emit as _emit, format_3d, format_plan, write_picture
from planner.cli.argtypes import EXIT_INFEASIBLE, EXIT_NOT_OPTIMAL, EXIT_OK, does_not_fit
from planner.cli.argtypes import memory_limit, plan_source
from planner.cli.parser import DEGREE_OPTIONS, PIPELINE_OPTIONS, SETTINGS_DEFAULTS, log
from planner.zoo import load_model, model_names
from planner.launch import evaluate_torchtitan
from planner.launch.gap import compare_best
from planner.launch import evaluate_megatron
from planner.show import tables, view


def progress_bar(args: argparse.Namespace):
    """A one-line progress bar on stderr, only when stderr is a terminal and not --quiet."""
    if args.quiet or not sys.stderr.isatty():
        return None

    def report(done: int, total: int, label: str) -> None:
        width = 30
        filled = int(width * done / max(1, total))
        end = "\n" if done >= total else ""
        print(
            f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}",
            end=end,
            file=sys.stderr,
            flush=True,
        )

    return report


def _given(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    return [
        "--" + n.replace("_", "-") for n in names if getattr(args, n, None) not in (None, False)
    ]


def _refuse(args: argparse.Namespace, names: Sequence[str], why: str) -> None:
    given = _given(args, names)
    if given:
        raise SettingsError(f"{given[0]}: {why}")


def _status_code(status: str, require_optimal: bool, explanation: str = "") -> int:
    if status in ("OPTIMAL", "HEURISTIC", "GIVEN"):
        return EXIT_OK
    if status == "FEASIBLE":
        log.warning(
            "the solver stopped at its time limit: the plan is FEASIBLE, not proven optimal "
            "(raise --time-limit for a proof)"
        )
        if require_optimal:
            print(
                "planner: error: --require-optimal: the plan is FEASIBLE, not proven optimal",
                file=sys.stderr,
            )
            return EXIT_NOT_OPTIMAL
        return EXIT_OK
    if status == "INFEASIBLE":
        print(
            f"planner: infeasible: {explanation or 'no plan fits the memory limit'}",
            file=sys.stderr,
        )
    else:
        print(
            f"planner: no plan: the search ended {status} ({explanation or 'raise --time-limit'})",
            file=sys.stderr,
        )
    return EXIT_INFEASIBLE


def _finish(plan: Plan, args: argparse.Namespace) -> int:
    if plan.fits_memory is False:  # a heuristic's or a given plan that does not fit: a failure
        _emit(format_plan(plan), args)
        return does_not_fit(plan.memory_per_device_bytes, plan.memory_limit_bytes, args)
    found = plan.status not in ("INFEASIBLE", "UNKNOWN")
    if args.json is not None and found:  # no plan file for a run that found no plan
        data = plan.to_dict(timings=not args.no_timings)
        data["source"] = plan_source(args)
        write_json(args.json, data)
    if args.csv is not None:
        write_csv(args.csv, [plan.summary_row(timings=not args.no_timings)])
    _emit(format_plan(plan), args)
    return _status_code(plan.status, getattr(args, "require_optimal", False), plan.explanation)


def _finish_3d(result, args: argparse.Namespace) -> int:
    if not result.pipeline.fits_memory:
        _emit(format_3d(result), args)
        return does_not_fit(result.pipeline.max_memory_bytes, result.memory_limit_bytes, args)
    if args.json is not None:
        data = result.to_dict(timings=not args.no_timings)
        data["source"] = plan_source(args)
        write_json(args.json, data)
    if args.csv is not None:
        write_csv(args.csv, [result.summary_row(timings=not args.no_timings)])
    _emit(format_3d(result), args)
    return _status_code(
        result.intra_status if result.pipeline.fits_memory else "INFEASIBLE",
        getattr(args, "require_optimal", False),
    )


def cmd_models(args: argparse.Namespace) -> int:

    lines = [f"{'model':20s} {'parameters':>14s} {'operators':>10s} {'GFLOPs/sample':>14s}"]
    for name in model_names():
        graph = load_model(name)
        samples = graph.batch_size
        lines.append(
            f"{name:20s} {graph.num_params:14,d} {len(graph.operators):10d} "
            f"{graph.flops / samples / 1e9:14.2f}"
        )
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
    # `pipeline` may size it from --devices
    mesh = args.mesh or ("8" if args.command == "plan" else None)
    search, intra = engine_search(args)
    result = search(
        args.model,
        mesh,
        args.device or "a100-80g",
        devices=getattr(args, "devices", None),
        batch=args.batch,
        seq=args.seq,
        memory=memory_limit(args),
        settings=_settings(args),
        schedule=args.schedule or "1f1b",
        method=args.pipeline_method or "csimd",
        **intra,
        time_limit_s=args.time_limit,
        seed=args.seed,
        jobs=_jobs(args),
        degrees=[args.pp] if args.pp else None,
        counts=[args.num_microbatches] if args.num_microbatches not in (None, "auto") else None,
        cuts=args.cuts,
        hardware_csv=args.hardware,
        progress=progress_bar(args),
        **({"certify": True} if getattr(args, "certify", False) else {}),
    )
    return _finish_3d(result, args)


def cmd_plan(args: argparse.Namespace) -> int:
    if args.top_k is not None:
        return cmd_top_k(args)
    if args.pipeline == "auto" or args.engine:
        return cmd_pipeline(args)
    flat = tuple(name for name in PIPELINE_OPTIONS if name != "num_microbatches")
    _refuse(args, flat, "only with --pipeline auto (or `planner pipeline`)")
    count = args.num_microbatches or 1
    search = accumulation.plan_counts if count == "auto" else api.plan
    plan = search(
        args.model,
        args.mesh or "8",
        args.device or "a100-80g",
        **({} if count == "auto" else {"num_microbatches": count}),
        method=args.method,
        batch=args.batch,
        seq=args.seq,
        memory=memory_limit(args),
        settings=_settings(args),
        time_limit_s=args.time_limit,
        seed=args.seed,
        hardware_csv=args.hardware,
        jobs=_jobs(args),
        progress=progress_bar(args),
    )
    return _finish(plan, args)


def cmd_evaluate(args: argparse.Namespace) -> int:
    if args.from_megatron or args.from_torchtitan:
        return _evaluate_launch(args)
    _refuse(args, ("config",), "only with --from-torchtitan")
    _refuse(args, ("compare_best",), "only with --from-megatron or --from-torchtitan")
    if args.plan:
        _refuse(args, DEGREE_OPTIONS, "not with --plan (the plan file fixes the configuration)")
        return _evaluate_file(args)
    if args.tp is None and args.dp is None and args.pp is None:
        raise SettingsError(
            "--plan: give a plan JSON (--plan PATH) or Megatron degrees (--tp/--dp/--pp)"
        )
    _refuse(args, ("mesh",), "not with --tp/--dp/--pp (the mesh is pp=P,dp=D,tp=T)")
    if not args.model:
        raise SettingsError("--model: required with --tp/--dp/--pp")
    dp = args.dp or 1
    micro_batch = args.micro_batch
    if micro_batch is None:
        samples = api.resolve_model(args.model, args.batch, args.seq).batch_size
        if samples % dp:
            raise SettingsError(
                f"--batch: the global batch {samples} is not divisible by --dp {dp}"
            )
        micro_batch = samples // dp
    result = api3d.evaluate_3d(
        args.model,
        args.device or "a100-80g",
        tp=args.tp or 1,
        pp=args.pp or 1,
        dp=dp,
        micro_batch=micro_batch,
        batch=args.batch,
        seq=args.seq,
        settings=_settings(args),
        schedule=args.schedule or "1f1b",
        memory=memory_limit(args),
        cuts=args.cuts,
        hardware_csv=args.hardware,
        fit_required=False,
    )
    return _finish_3d(result, args)


def _evaluate_launch(args: argparse.Namespace) -> int:
    """A Megatron-LM line or a torchtitan config costed as given (``planner.launch``)."""
    source = "--from-megatron" if args.from_megatron else "--from-torchtitan"
    fixed = ("plan", "model", "mesh", "batch", "seq") + DEGREE_OPTIONS[:1] + DEGREE_OPTIONS[2:]
    _refuse(args, fixed + tuple(SETTINGS_DEFAULTS), f"not with {source} (the config fixes it)")
    if args.from_megatron and args.from_torchtitan:
        raise SettingsError("--from-torchtitan: not with --from-megatron (one config at a time)")
    if args.from_torchtitan:
        result, run = evaluate_torchtitan(
            args.from_torchtitan,
            args.config or "planner_plan",
            args.device or "a100-80g",
            args.dp,
            memory_limit(args),
            args.hardware,
        )
        _best_gap(args, run, result)
        args.model, args.batch = run.model_spec, run.global_batch
        return _finish_3d(result, args)
    _refuse(args, ("config",), "only with --from-torchtitan")
    return _evaluate_megatron(args)


def _best_gap(args: argparse.Namespace, run, result) -> None:
    """--compare-best: the gap to the best Megatron-LM configuration and what closes it."""
    if not args.compare_best:
        return

    engine = "torchtitan" if args.from_torchtitan else "megatron"
    gap = compare_best(
        run, result, args.device or "a100-80g", memory_limit(args), args.hardware, engine
    )
    _emit("\n".join(gap.lines()), args)


def _evaluate_megatron(args: argparse.Namespace) -> int:
    """A Megatron-LM line costed as given (``planner.launch.evaluate_megatron``)."""

    # a launch script or argument file is a few KiB; 1 MiB is not one (/dev/zero, a binary)
    text = read_text(args.from_megatron, "--from-megatron", SettingsError, max_bytes=1 << 20)
    result, run, ignored = evaluate_megatron(
        text, args.device or "a100-80g", args.dp, memory_limit(args), args.hardware
    )
    if ignored:
        _emit(f"ignored (no effect on step time or memory): {' '.join(ignored)}", args)
    _best_gap(args, run, result)
    args.model, args.batch = run.model_spec, run.global_batch
    return _finish_3d(result, args)


def _evaluate_file(args: argparse.Namespace) -> int:
    """Re-cost a plan JSON on its own mesh, device, settings and memory limit (options given
    override)."""
    data = read_plan_file(args.plan)
    if (
        args.mesh
        and parse_mesh(args.mesh, SYMBOLIC).spec != parse_mesh(data["mesh"], SYMBOLIC).spec
    ):
        raise SettingsError(
            f"--mesh: {args.mesh!r} differs from the plan's mesh {data['mesh']!r}; drop --mesh"
        )
    result = recost(args, data, args.plan)
    return _finish_3d(result, args) if "pipeline" in data else _finish(result, args)


def cmd_compare(args: argparse.Namespace) -> int:
    check_picture(args)  # a bad picture name is refused before the searches and any file
    rows = api.compare(
        args.model,
        args.mesh or "8",
        args.device or "a100-80g",
        methods=tuple(args.methods.split(",")),
        batch=args.batch,
        seq=args.seq,
        memory=memory_limit(args),
        settings=_settings(args),
        time_limit_s=args.time_limit,
        seed=args.seed,
        hardware_csv=args.hardware,
    )
    if args.no_timings:
        rows = [{k: v for k, v in r.items() if k != "search_time_s"} for r in rows]
    if args.csv is not None:
        write_csv(args.csv, rows)
    if args.json is not None:
        write_json(args.json, {"source": plan_source(args), "rows": rows})
    write_picture(args, lambda draw: draw.compare_figure(rows))
    lines = [
        f"{'method':10s} {'status':10s} {'step ms':>10s} {'gap %':>8s} {'mem GiB':>8s} "
        f"{'fits':>5s} {'search s':>9s}"
    ]
    for r in rows:
        gap = "-" if r["gap_to_exact_percent"] is None else f"{r['gap_to_exact_percent']:.2f}"
        search = f"{r['search_time_s']:9.3f}" if "search_time_s" in r else f"{'-':>9s}"
        lines.append(
            f"{r['method']:10s} {r['status']:10s} {r['estimated_step_time_s'] * 1e3:10.3f} "
            f"{gap:>8s} {r['memory_per_device_bytes'] / 2**30:8.2f} {str(r['fits_memory']):>5s} "
            f"{search}"
        )
    _emit("\n".join(lines), args)
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:

    data = read_plan_file(args.plan)
    # a hand-edited number or strategy is refused, not drawn
    _, again = checked(args, data, args.plan)
    kept = {k: data[k] for k in ("source", "search_time_s") if k in data}
    shown = view.view_of({**again, **kept}, args.plan)
    what = ("schedule", "memory", "sharding") if args.what == "all" else (args.what,)
    write_picture(args, lambda draw: draw.plan_figure(shown, what))
    if args.text or (args.png is None and args.svg is None):
        _emit(tables.tables(shown, what), args)
    else:
        _emit(f"{', '.join(what)} of {args.plan} -> {args.png or args.svg}", args)
    return EXIT_OK


COMMANDS = {
    "models": cmd_models,
    "import-torch": cmd_import_torch,
    "export": cmd_export,
    "verify": cmd_verify,
    "show": cmd_show,
    "run-jax": cmd_run_jax,
    "run-torch": cmd_run_torch,
    "plan": cmd_plan,
    "evaluate": cmd_evaluate,
    "compare": cmd_compare,
    "pareto": cmd_pareto,
    "pipeline": cmd_pipeline,
}
