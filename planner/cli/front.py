"""``planner pareto``: the exact time-memory front (``planner.front``) as a table, CSV and JSON."""

from __future__ import annotations

import argparse

from planner.cli.recost import settings_from_args
from planner.cli.report import emit
from planner.cli.argtypes import EXIT_INFEASIBLE, EXIT_OK
from planner.front import pareto_front
from planner.outputs import write_csv, write_json


def cmd_pareto(args: argparse.Namespace) -> int:
    front = pareto_front(
        args.model,
        args.mesh or "8",
        args.device or "a100-80g",
        batch=args.batch,
        seq=args.seq,
        memory=args.memory,
        settings=settings_from_args(args),
        max_points=args.max_points,
        time_limit_s=args.time_limit,
        seed=args.seed,
        hardware_csv=args.hardware,
    )
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
                "points": [p.to_dict(timings=not args.no_timings) for p in front.plans],
            },
        )
    emit(_table(front), args)
    return EXIT_OK if front.plans else EXIT_INFEASIBLE


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
