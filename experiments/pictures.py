"""Pictures of plans for the README: a GPT-3 175B 3D plan on 1024 A100s, gpt2-small on 2x4 (exact),
and the search methods compared on gpt2-small 2x4.

Each picture is drawn by ``planner.plan_figure`` / ``planner.show.draw.compare_figure`` (what
``planner show`` and ``planner compare --png`` draw) and read back from the figure's artists: the
CSV records, per picture, the plan's step time and peak memory beside the sums of the drawn bars,
and the Gantt blocks drawn beside stages x micro-batches x passes.

    python -m experiments.pictures [--smallest] [--out results/pictures.csv]

Writes ``<out stem>_<case>.png`` per plan and ``<out stem>.png`` (the comparison).
"""

from __future__ import annotations

import argparse
import time

import planner
from planner.show.draw import compare_figure, figure_bytes
from experiments.common import add_output_options, results_table, run
from planner.outputs import write_bytes

# (case, model, mesh, batch, pipeline degrees searched: None = flat plan, () = every divisor)
CASES = (
    ("gpt3-175b-3d", "gpt3-175b", "node=128,gpu=8", 1536, ()),
    ("gpt2-small-2x4", "gpt2-small", "2x4", None, None),
)
SMALLEST = (
    ("gpt-3d", "gpt:layers=4,hidden=256,heads=4,seq=64,vocab=512", "4x2", 16, (2,)),
    ("gpt-2x2", "gpt:layers=2,hidden=256,heads=4,seq=64,vocab=512", "2x2", 8, None),
)
COMPARE_METHODS = ("exact", "sapp", "megatron", "dp", "zero")


def drawn(fig, prefix: str, size: str) -> float:
    """Sum of the widths or heights of the bars whose gid starts with ``prefix``."""
    return sum(
        getattr(p, f"get_{size}")()
        for ax in fig.axes
        for p in ax.patches
        if (p.get_gid() or "").startswith(prefix)
    )


def plan_row(case: str, model: str, mesh: str, batch: int | None, degrees) -> tuple[dict, object]:
    start = time.perf_counter()
    threed = degrees is not None
    if threed:
        result = planner.plan_pipeline(
            model, mesh, "a100-80g", batch=batch, degrees=list(degrees) or None
        )
        data = result.to_dict()
        step, memory, status = data["iteration_time_s"], data["max_memory_bytes"], data["status"]
    else:
        result = planner.plan(model, mesh, "a100-80g", batch=batch)
        data = result.to_dict()
        step, memory, status = (
            data["estimated_step_time_s"],
            data["memory_per_device_bytes"],
            data["status"],
        )
    search = time.perf_counter() - start
    fig = planner.plan_figure(data)
    row = {
        "case": case,
        "model": model,
        "mesh": data["mesh"],
        "status": status,
        "objective": step,
        "step_time_s": step,
        "memory_bytes": memory,
        "search_wall_s": search,
    }
    row.update(_drawn_3d(fig, data) if threed else _drawn_flat(fig))
    row["draw_wall_s"] = time.perf_counter() - start - search
    return row, fig


def _drawn_3d(fig, data: dict) -> dict:
    """What the 3D picture draws: the worst stage's memory bars and the Gantt's block count, with
    the count the schedule implies."""
    pipe = data["pipeline"]
    passes = 3 if data["settings"]["recompute"] != "none" else 2
    chunks = int(pipe["schedule"].partition(":")[2] or 1)
    stage_memory = [
        sum(
            p.get_height()
            for ax in fig.axes
            for p in ax.patches
            if (p.get_gid() or "").startswith("memory:")
            and round(p.get_x() + p.get_width() / 2) == k
        )
        * 2**30
        for k in range(pipe["stages"])
    ]
    return dict(
        drawn_memory_bytes=max(stage_memory),
        schedule=pipe["schedule"],
        stages=pipe["stages"],
        num_microbatches=pipe["num_microbatches"],
        gantt_blocks=sum(drawn_count(fig, name) for name in ("forward", "backward", "recompute")),
        expected_blocks=pipe["stages"] * pipe["num_microbatches"] * passes * chunks,
    )


def _drawn_flat(fig) -> dict:
    return dict(
        drawn_step_time_s=drawn(fig, "step:", "width") / 1e3,
        drawn_memory_bytes=drawn(fig, "memory:", "height") * 2**30,
    )


def drawn_count(fig, gid: str) -> int:
    return sum(1 for ax in fig.axes for p in ax.patches if p.get_gid() == gid)


def compare_row(model: str, mesh: str, batch: int | None) -> tuple[dict, object]:
    start = time.perf_counter()
    rows = planner.compare(model, mesh, "a100-80g", methods=COMPARE_METHODS, batch=batch)
    fig = compare_figure(rows)
    planned = [r for r in rows if r["status"] not in ("INFEASIBLE", "UNKNOWN")]
    return {
        "case": "compare",
        "model": model,
        "mesh": rows[0]["mesh"],
        "status": "OK",
        "objective": sum(r["estimated_step_time_s"] for r in planned),
        "step_time_s": sum(r["estimated_step_time_s"] for r in planned),
        "drawn_step_time_s": drawn(fig, "step:", "height") / 1e3,
        "memory_bytes": sum(r["memory_per_device_bytes"] for r in planned),
        "drawn_memory_bytes": drawn(fig, "memory:", "height") * 2**30,
        "search_wall_s": time.perf_counter() - start,
    }, fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--smallest", action="store_true", help="small GPTs on 8 and 4 devices (tests)"
    )
    add_output_options(parser, "results/pictures.csv")
    args = parser.parse_args(argv)
    cases = SMALLEST if args.smallest else CASES
    table = results_table(args, ("case",))
    stem = str(args.out).rsplit(".", 1)[0]

    def body() -> int:
        for case, model, mesh, batch, threed in cases:
            if table.done(case=case):
                continue
            row, fig = plan_row(case, model, mesh, batch, threed)
            if args.plot:
                write_bytes(f"{stem}_{case}.png", figure_bytes(fig, "png"), "--png")
            table.add([row])
            print(
                f"{case}: {row['status']} {row['step_time_s'] * 1e3:.3f} ms, drawn and checked",
                flush=True,
            )
        _, model, mesh, batch, _ = cases[1]
        if not table.done(case="compare"):
            row, fig = compare_row(model, mesh, batch)
            if args.plot:
                write_bytes(f"{stem}.png", figure_bytes(fig, "png"), "--png")
            table.add([row])
        table.finish()
        return 0

    return run(body)


if __name__ == "__main__":
    raise SystemExit(main())
