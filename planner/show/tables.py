"""The text form of ``planner show`` (``--text``, or no matplotlib): the same content as the
pictures."""

from __future__ import annotations

from planner.units import bytes_text
from planner.pipeline.timeline import bubbles, makespan
from planner.show.view import MEMORY_PARTS, PlanView


def schedule_table(view: PlanView) -> str:
    if not view.is_3d:
        compute = view.field("compute_s")
        hidden = float(view.data.get("hidden_s", 0.0))
        lines = [
            f"step {view.step_time_s * 1e3:.3f} ms: compute {compute * 1e3:.3f} ms, exposed "
            f"communication {(view.step_time_s - compute) * 1e3:.3f} ms, hidden behind compute "
            f"{hidden * 1e3:.3f} ms",
            f"{'collective (kind axis)':28s} {'ms':>10s}",
        ]
        lines += [f"{name:28s} {seconds * 1e3:10.3f}" for name, seconds in view.comm_parts()]
        return "\n".join(lines)
    schedule, stages, count = view.pipeline()
    details = view.stages()
    blocks = view.timeline()
    idle = {k: 0.0 for k in range(stages)}
    for k, start, end in bubbles(blocks, stages):
        idle[k] += end - start
    lines = [
        f"{schedule}: {stages} stages x {count} micro-batches; simulated iteration "
        f"{makespan(blocks) * 1e3:.2f} ms, cost model {view.step_time_s * 1e3:.2f} ms",
        f"{'stage':>5s} {'layers':>9s} {'fwd ms':>8s} {'bwd ms':>8s} {'recomp ms':>9s} "
        f"{'comm ms':>8s} {'send ms':>8s} {'per mb ms':>9s} {'sync ms':>8s} {'bubble ms':>9s}",
    ]
    for d in details:
        comm = d.forward_comm_s + d.backward_comm_s - d.hidden_s
        lines.append(
            f"{d.stage:5d} {d.first_layer:4d}-{d.end_layer - 1:<4d} {d.forward_s * 1e3:8.3f} "
            f"{d.backward_s * 1e3:8.3f} {d.recompute_s * 1e3:9.3f} {comm * 1e3:8.3f} "
            f"{d.send_s * 1e3:8.3f} {d.time_per_microbatch_s * 1e3:9.3f} "
            f"{d.grad_sync_s * 1e3:8.3f} {idle[d.stage] * 1e3:9.2f}"
        )
    return "\n".join(lines)


def memory_table(view: PlanView) -> str:
    per_stage = view.stage_memory()
    parts = [p for p in MEMORY_PARTS if any(dict(s).get(p) for s in per_stage)]
    limit = "none" if view.memory_limit_bytes is None else bytes_text(view.memory_limit_bytes)
    lines = [
        f"memory per device (GiB), device limit {limit}",
        f"{'stage':>6s} " + " ".join(f"{p:>11s}" for p in parts) + f" {'total':>9s}",
    ]
    for k, stage in enumerate(per_stage):
        values = dict(stage)
        label = str(k) if view.is_3d else "all"
        lines.append(
            f"{label:>6s} "
            + " ".join(f"{values.get(p, 0.0) / 2**30:11.3f}" for p in parts)
            + f" {sum(values.values()) / 2**30:9.3f}"
        )
    return "\n".join(lines)


def sharding_table(view: PlanView) -> str:
    lines = [f"{'operator':40s} " + " ".join(f"{axis:>8s}" for axis in view.axes)]
    for group in view.layer_groups():
        lines.append(f"-- {group.label}")
        lines += [
            f"{name[:40]:40s} " + " ".join(f"{dim or '-':>8s}" for dim in strategy)
            for name, strategy in group.rows
        ]
    return "\n".join(lines)


def tables(view: PlanView, what: tuple[str, ...]) -> str:
    make = {"schedule": schedule_table, "memory": memory_table, "sharding": sharding_table}
    return "\n\n".join(make[name](view) for name in what)
