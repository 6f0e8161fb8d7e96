"""Figures of a plan with matplotlib's object API (no pyplot state): schedule, memory, sharding.

Every drawn quantity comes from the plan JSON (``PlanView``); each bar or block carries a gid
(``forward``, ``backward``, ``recompute``, ``comm``, ``sync``, ``bubble``, ``step:...``,
``comm:...``, ``memory:...``) so tests can read the drawn data back from the figure's artists.
"""

from __future__ import annotations

import io

from planner.errors import SettingsError
from planner.pipeline.timeline import PASSES, bubbles, makespan
from planner.show.marks import (
    COLOURS,
    FAMILY_COLOURS,
    LEGEND,
    hbars,
    legend,
    limit_line,
    limit_note,
    palette,
    vbars,
)
from planner.show.view import DIM_FAMILIES, MEMORY_PARTS, PlanView, dim_family, view_of

WHAT = ("schedule", "memory", "sharding")
WIDTH_IN, DPI = 12.0, 100
MAX_ROWS = 120  # sharding rows drawn; --text lists all


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise SettingsError(
            "--png/--svg: pictures need matplotlib; install the plot extra: pip install "
            "'planner[plot]' (or use --text)"
        ) from None
    return Figure


def panel_heights(view: PlanView, what: tuple[str, ...]) -> list[float]:
    """Inches per panel: the Gantt grows with the stage rows, the sharding map with its
    operators."""
    heights = []
    for name in what:
        if name == "schedule" and view.is_3d:
            schedule, stages, _ = view.pipeline()
            chunks = (
                int(schedule.partition(":")[2] or 2) if schedule.startswith("interleaved") else 1
            )
            heights.append(2.0 + 0.3 * stages * chunks)
        elif name == "sharding":
            heights.append(1.5 + 0.2 * min(MAX_ROWS, sum(len(g.rows) for g in view.layer_groups())))
        else:
            heights.append(3.5)
    return heights


def plan_figure(view: PlanView, what: tuple[str, ...] = WHAT):
    """One figure with a panel per entry of ``what`` (in that order); ``view``: a ``PlanView``, or a
    plan (``Plan``, ``Plan3D``) or its dict."""
    if not isinstance(view, PlanView):
        view = view_of(view if isinstance(view, dict) else view.to_dict())
    unknown = [name for name in what if name not in WHAT]
    if unknown:
        raise SettingsError(f"--what: unknown picture {unknown[0]!r} (known: {', '.join(WHAT)})")
    heights = panel_heights(view, what)
    fig = _figure_class()(figsize=(WIDTH_IN, sum(heights)), dpi=DPI, layout="constrained")
    axes = fig.subplots(len(what), 1, height_ratios=heights, squeeze=False)[:, 0]
    for ax, name in zip(axes, what):
        {"schedule": draw_schedule, "memory": draw_memory, "sharding": draw_sharding}[name](
            ax, view
        )
    fig.suptitle(f"{view.model} on {view.mesh} ({view.device})")
    return fig


def draw_schedule(ax, view: PlanView) -> None:
    """A Gantt chart of one iteration (3D plan), or the step split into compute and collectives."""
    if not view.is_3d:
        return _draw_step(ax, view)
    stages = view.pipeline()[1]
    blocks = view.timeline()
    chunks = 1 + max(b.chunk for b in blocks)
    row = lambda b: b.stage * chunks + b.chunk
    for kind in PASSES + ("sync",):
        chosen = [b for b in blocks if b.kind == kind]
        if kind != "sync":  # a pass: its compute, then its exposed communication
            hbars(
                ax,
                [row(b) for b in chosen],
                [b.compute_s * 1e3 for b in chosen],
                [b.start_s * 1e3 for b in chosen],
                COLOURS[kind],
                kind,
            )
        exposed = [b for b in chosen if b.comm_s > 0]
        hbars(
            ax,
            [row(b) for b in exposed],
            [b.comm_s * 1e3 for b in exposed],
            [(b.start_s + b.compute_s) * 1e3 for b in exposed],
            COLOURS["sync" if kind == "sync" else "comm"],
            "sync" if kind == "sync" else "comm",
        )
    idle = bubbles(blocks, stages)
    hbars(
        ax,
        [k * chunks + (chunks - 1) / 2 for k, _, _ in idle],
        [(e - s) * 1e3 for _, s, e in idle],
        [s * 1e3 for _, s, _ in idle],
        COLOURS["bubble"],
        "bubble",
        height=0.8 * chunks,
    )
    ax.axvline(view.step_time_s * 1e3, color="black", linestyle="--", linewidth=1, gid="model")
    _schedule_axes(ax, view, blocks, chunks)
    legend(
        ax,
        ("forward", "backward")
        + (("recompute",) if any(b.kind == "recompute" for b in blocks) else ())
        + ("comm", "sync", "bubble"),
        labels={"comm": "exposed communication", "sync": "gradient sync"},
    )


def _schedule_axes(ax, view: PlanView, blocks, chunks: int) -> None:
    """A row per stage (and model chunk), time in ms, the title with both step times."""
    schedule, stages, count = view.pipeline()
    labels = [
        f"stage {k}" + (f".{c}" if chunks > 1 else "") for k in range(stages) for c in range(chunks)
    ]
    ax.set_yticks(range(stages * chunks), labels)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(
        f"{schedule}: {stages} stages x {count} micro-batches; simulated "
        f"{makespan(blocks) * 1e3:.1f} ms, cost model {view.step_time_s * 1e3:.1f} ms (dashed)",
        fontsize=9,
    )


def _draw_step(ax, view: PlanView) -> None:
    compute = view.field("compute_s")
    hidden = float(view.data.get("hidden_s", 0.0))
    comm = view.comm_parts()
    exposed = view.step_time_s - compute
    hbars(
        ax,
        [0, 0],
        [compute * 1e3, exposed * 1e3],
        [0, compute * 1e3],
        [COLOURS["compute"], COLOURS["comm"]],
        ["step:compute", "step:comm"],
    )
    left, colours = 0.0, palette(len(comm))
    for (name, seconds), colour in zip(comm, colours):
        hbars(ax, [1], [seconds * 1e3], [left], colour, f"comm:{name}", label=name)
        left += seconds * 1e3
    if hidden > 0:
        hbars(
            ax,
            [1],
            [hidden * 1e3],
            [0.0],
            "none",
            "hidden",
            hatch="xx",
            label="hidden behind compute",
            edge="black",
        )
    ax.set_yticks([0, 1], ["step (compute + exposed comm)", "collectives (kind, mesh axis)"])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(
        f"step {view.step_time_s * 1e3:.3f} ms = compute {compute * 1e3:.3f} + communication "
        f"{left:.3f} - hidden {hidden * 1e3:.3f}",
        fontsize=9,
    )
    ax.legend(**LEGEND)


def draw_memory(ax, view: PlanView) -> None:
    """Stacked bars of memory per device per stage, with the device limit."""
    per_stage = view.stage_memory()
    bottom = [0.0] * len(per_stage)
    for part in MEMORY_PARTS:
        heights = [dict(parts).get(part, 0.0) / 2**30 for parts in per_stage]
        if any(heights):
            vbars(
                ax,
                range(len(per_stage)),
                heights,
                bottom,
                COLOURS[part],
                f"memory:{part}",
                label=part,
            )
            bottom = [b + h for b, h in zip(bottom, heights)]
    limit_line(ax, view.memory_limit_bytes, max(bottom))
    ax.set_xticks(
        range(len(per_stage)),
        [f"{k}" for k in range(len(per_stage))] if view.is_3d else ["every device"],
    )
    ax.set_xlabel("pipeline stage" if view.is_3d else "")
    ax.set_ylabel("GiB per device")
    ax.set_title(
        f"memory per device: peak {max(bottom):.2f} GiB"
        + limit_note(view.memory_limit_bytes, max(bottom)),
        fontsize=9,
    )
    if len(per_stage) == 1:
        ax.set_xlim(-2, 2)
    ax.legend(**LEGEND)


def draw_sharding(ax, view: PlanView) -> None:
    """A grid of operators (identical layers folded) by mesh axis; each cell names the split dim."""
    from matplotlib.colors import ListedColormap

    families = [family for family, _ in DIM_FAMILIES] + ["other", "replicate"]
    groups = view.layer_groups()
    rows = [
        (f"{g.label}: {name}" if i == 0 else name, strategy)
        for g in groups
        for i, (name, strategy) in enumerate(g.rows)
    ]
    starts = [sum(len(g.rows) for g in groups[:k]) for k in range(1, len(groups))]
    shown = rows[:MAX_ROWS]
    grid = [[families.index(dim_family(d)) for d in strategy] for _, strategy in shown]
    ax.imshow(
        grid,
        cmap=ListedColormap([FAMILY_COLOURS[f] for f in families]),
        vmin=0,
        vmax=len(families) - 1,
        aspect="auto",
        interpolation="nearest",
        gid="sharding",
    )
    for i, (_, strategy) in enumerate(shown):
        for j, dim in enumerate(strategy):
            ax.text(j, i, dim or "-", ha="center", va="center", fontsize=7, gid="cell")
    ax.set_xticks(range(len(view.axes)), view.axes)
    ax.set_yticks(range(len(shown)), [name for name, _ in shown], fontsize=7)
    for i in (i for i in starts if i < len(shown)):  # a line between layer groups
        ax.axhline(i - 0.5, color="black", linewidth=1)
    ax.xaxis.tick_top()
    more = (
        f" (first {MAX_ROWS} of {len(rows)} rows; --text lists all)" if len(rows) > MAX_ROWS else ""
    )
    ax.set_title(f"sharding: the dim each mesh axis splits{more}", fontsize=9)
    used = sorted({dim_family(d) for _, s in shown for d in s}, key=families.index)
    legend(ax, used, colours=FAMILY_COLOURS)


def compare_figure(rows: list[dict]):
    """Methods side by side: step time (compute + exposed communication) and memory per device."""
    fig = _figure_class()(figsize=(WIDTH_IN, 4.5), dpi=DPI, layout="constrained")
    time_ax, memory_ax = fig.subplots(1, 2)
    planned = [r for r in rows if r.get("status") not in ("INFEASIBLE", "UNKNOWN")]
    names = [r["method"] for r in planned]
    compute = [r["compute_s"] * 1e3 for r in planned]
    exposed = [(r["estimated_step_time_s"] - r["compute_s"]) * 1e3 for r in planned]
    vbars(
        time_ax,
        range(len(names)),
        compute,
        [0.0] * len(names),
        COLOURS["compute"],
        "step:compute",
        label="compute",
    )
    vbars(
        time_ax,
        range(len(names)),
        exposed,
        compute,
        COLOURS["comm"],
        "step:comm",
        label="exposed communication",
    )
    time_ax.set_xticks(range(len(names)), names, rotation=30)
    time_ax.set_ylabel("step time (ms)")
    time_ax.legend(fontsize=7)
    _compare_memory(memory_ax, planned, names)
    missing = sorted(r["method"] for r in rows if r not in planned)
    fig.suptitle(
        f"{rows[0]['model'] if rows else ''}: methods compared"
        + (f" (no plan: {', '.join(missing)})" if missing else "")
    )
    return fig


def _compare_memory(ax, planned: list[dict], names: list[str]) -> None:
    """Each method's memory per device, stacked by part, and the device limit when all share one."""
    bottom = [0.0] * len(names)
    for part in MEMORY_PARTS[:4]:
        heights = [r.get(f"memory_{part}_bytes", 0.0) / 2**30 for r in planned]
        where = range(len(names))
        vbars(ax, where, heights, bottom, COLOURS[part], f"memory:{part}", label=part)
        bottom = [b + h for b, h in zip(bottom, heights)]
    limits = {r.get("memory_limit_bytes") for r in planned} - {None}
    limit = limits.pop() if len(limits) == 1 else None
    limit_line(ax, limit, max(bottom, default=0.0))
    ax.set_title("memory per device" + limit_note(limit, max(bottom, default=0.0)), fontsize=9)
    ax.set_xticks(range(len(names)), names, rotation=30)
    ax.set_ylabel("GiB per device")
    ax.legend(fontsize=7)


def figure_bytes(fig, fmt: str) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=DPI)
    return buffer.getvalue()


def front_figure(rows: list[dict]):
    """The time-memory front: each point's memory per device against its step time, as steps."""
    fig = _figure_class()(figsize=(WIDTH_IN * 0.6, 3.5), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    memory = [r["memory_per_device_bytes"] / 2**30 for r in rows]
    step = [r["estimated_step_time_s"] * 1e3 for r in rows]
    ax.step(memory, step, where="post", color=COLOURS["compute"], linewidth=1)
    ax.plot(memory, step, "o", color=COLOURS["comm"], markersize=3, gid="front:point")
    ax.set_xlabel("memory per device (GiB)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"time-memory front: {len(rows)} points", fontsize=9)
    return fig
