"""``planner pareto`` (the exact time-memory front) and ``planner plan --top-k`` (the k best
plans) from ``planner.front``, as tables, CSV and JSON."""

from __future__ import annotations

import argparse

from planner.cli.recost import settings_from_args
from planner.cli.report import check_picture, emit, write_picture
from planner.cli.argtypes import EXIT_OK, infeasible, memory_limit, plan_source
from planner.errors import SettingsError
from planner.front import pareto_front, top_plans
from planner.outputs import write_csv, write_json


def _problem_options(args: argparse.Namespace) -> dict:
    """The model, cluster, settings and search options both commands pass on."""
    return dict(
        batch=args.batch,
        seq=args.seq,
        memory=memory_limit(args),
        settings=settings_from_args(args),
        time_limit_s=args.time_limit,
        seed=args.seed,
        hardware_csv=args.hardware,
    )


def cmd_pareto(args: argparse.Namespace) -> int:
    check_picture(args)  # a bad picture name is refused before the searches and any file
    front = pareto_front(
        args.model,
        args.mesh or "8",
        args.device or "a100-80g",
        max_points=args.max_points,
        **_problem_options(args),
    )
    if not front.plans:
        return infeasible(f"pareto: no plan fits the memory limit ({front.why})", args)
    rows = front.rows()
    if args.no_timings:
        rows = [{k: v for k, v in r.items() if k != "search_time_s"} for r in rows]
    if args.csv is not None:
        write_csv(args.csv, rows)
    if args.json is not None:
        write_json(
            args.json,
            {
                "format": "planner-front/1",
                "complete": front.complete,
                "searches": front.searches,
                "ended": front.why,
                "points": _entries(front.plans, args),
            },
        )
    write_picture(args, lambda draw: draw.front_figure(front.rows()))
    emit(_table(front), args)
    return EXIT_OK  # an empty front returned earlier


def _entries(plans, args: argparse.Namespace) -> list[dict]:
    """Each plan as a plan file of its own: its dict with the run's ``source``, so that one entry
    saved alone re-costs through ``evaluate --plan``."""
    source = plan_source(args)
    return [{**p.to_dict(timings=not args.no_timings), "source": source} for p in plans]


def _table(front) -> str:
    lines = [f"{'point':>5s} {'status':8s} {'step ms':>11s} {'memory GiB':>11s}  settings"]
    for k, p in enumerate(front.plans):
        settings = dict(p.settings)
        chosen = ", ".join(
            f"{name} {settings[name]}"
            for name in ("layer_recompute", "layer_zero")
            if settings.get(name)
        )
        lines.append(
            f"{k:5d} {p.status:8s} {p.estimated_step_time_s * 1e3:11.3f} "
            f"{p.memory_per_device_bytes / 2**30:11.3f}  {chosen}"
        )
    state = "complete" if front.complete else "cut"
    lines.append(
        f"{len(front.plans)} front points from {front.searches} searches ({state}: {front.why})"
    )
    return "\n".join(lines)


def cmd_top_k(args: argparse.Namespace) -> int:
    """plan --top-k K: the K best distinct plans (``planner.front.top_plans``)."""
    if args.pipeline == "auto" or args.engine:
        flag = "--for" if args.engine else "--pipeline auto"
        raise SettingsError(f"--top-k: not with {flag} (flat plans only for now)")
    if args.method not in ("exact", "whole"):
        raise SettingsError(f"--top-k: an exact search ranks plans, not --method {args.method}")
    if args.num_microbatches is not None:
        raise SettingsError("--num-microbatches: not with --top-k (it ranks one-micro-batch plans)")
    # --jobs has a default (1): refused when another count is asked for
    for name in ("pp", "schedule", "cuts", "pipeline_method", "jobs"):
        if getattr(args, name, None) not in (None, 1 if name == "jobs" else None):
            flag = "--" + name.replace("_", "-")
            raise SettingsError(f"{flag}: not with --top-k (it ranks flat plans in one process)")
    plans = top_plans(
        args.model,
        args.mesh or "8",
        args.device or "a100-80g",
        args.top_k,
        **_problem_options(args),
    )
    if not plans:
        return infeasible("--top-k: no plan fits the memory limit", args)
    timings = not args.no_timings
    if args.csv is not None:
        write_csv(
            args.csv, [{"rank": n + 1, **p.summary_row(timings)} for n, p in enumerate(plans)]
        )
    if args.json is not None:
        data = {"format": "planner-top-k/1", "plans": _entries(plans, args)}
        write_json(args.json, data)
    lines = [f"{'rank':>4s} {'status':8s} {'objective':>14s} {'step ms':>10s} {'memory GiB':>10s}"]
    for n, p in enumerate(plans):
        lines.append(
            f"{n + 1:4d} {p.status:8s} {p.objective:14,d} {p.estimated_step_time_s * 1e3:10.3f} "
            f"{p.memory_per_device_bytes / 2**30:10.3f}  {_differs(plans[0], p)}"
        )
    emit("\n".join(lines), args)
    return EXIT_OK  # no plan returned earlier


def _differs(first, plan) -> str:
    """Which operators take another strategy than in the best plan."""
    names = [a.name for a, b in zip(first.operators, plan.operators) if a.strategy != b.strategy]
    if not names:
        return ""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"differs in {shown}"
