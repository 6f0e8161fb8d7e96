"""Text reports of plans for the terminal (the command line prints these; nothing here writes
files)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter

from planner.errors import SettingsError
from planner.outputs import write_bytes
from planner.units import bytes_text
from planner.pipeline.plan3d import Plan3D
from planner.plans import Plan
from planner.show import draw

GIB = 2**30


def _group(name: str) -> str:
    return re.sub(r"(?<=[a-z])\d+(?=\.)", "*", name)


def format_plan(plan: Plan) -> str:
    """A flat (intra-operator) plan: status, time breakdown, memory, strategies grouped by layer."""
    gap = plan.gap_percent
    proof = (
        ""
        if plan.status in ("OPTIMAL", "INFEASIBLE", "UNKNOWN")
        else (
            f" (proven gap {gap:.2f}% to the bound {plan.bound})"
            if gap is not None
            else " (no bound: gap unknown)"
        )
    )
    head = (
        f"model {plan.model} on mesh {plan.mesh} ({plan.device}), method {plan.method}: "
        f"{plan.status}{proof}"
    )
    if not plan.found:  # no plan: the status and the reason only
        return "\n".join(
            [head, "no plan found", f"search time {plan.search_time_s:.2f} s"]
            + [f"note: {note}" for note in plan.notes]
            + ([f"why: {plan.explanation}"] if plan.explanation else [])
        )
    lines = [
        head,
        f"estimated step time {plan.estimated_step_time_s * 1e3:.3f} ms (compute "
        f"{plan.compute_s * 1e3:.3f} ms, communication {plan.comm_s * 1e3:.3f} ms, of which "
        f"{plan.hidden_s * 1e3:.3f} ms behind compute); objective {plan.objective} x "
        f"{plan.unit_s:g} s",
    ]
    if plan.comm_by_kind_s:
        lines.append(
            "communication: "
            + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in plan.comm_by_kind_s if v)
        )
    if plan.num_microbatches > 1:
        lines.append(
            f"gradient accumulation: {plan.num_microbatches} micro-batches a step (passes "
            "repeated, gradient sync and optimizer step once; memory of one micro-batch)"
        )
    lines.append(_memory_line(plan))
    lines.append(f"search time {plan.search_time_s:.2f} s")
    for field, what in (("layer_recompute", "recompute"), ("layer_zero", "ZeRO stage")):
        if dict(plan.settings).get(field):
            lines.append(f"{what} per layer (chosen by the search): {dict(plan.settings)[field]}")
    lines.extend(f"note: {note}" for note in plan.notes)
    if plan.explanation:
        lines.append(f"why: {plan.explanation}")
    lines.extend(_strategy_lines(plan))
    return "\n".join(lines)


def _memory_line(plan: Plan) -> str:
    total = bytes_text(plan.memory_per_device_bytes)
    unit = total.split()[-1]  # the parts in the unit of the total
    scale = {"GiB": GIB, "MiB": 2**20, "KiB": 2**10, "B": 1}[unit]
    mem = ", ".join(f"{k} {v / scale:.2f}" for k, v in plan.memory_breakdown)
    limit = f" of {bytes_text(plan.memory_limit_bytes)}" if plan.memory_limit_bytes else ""
    reserve = (
        f"; the device's reserve of {bytes_text(plan.reserve_bytes)} (CUDA context, NCCL "
        "buffers, workspaces) comes on top"
        if plan.reserve_bytes
        else ""
    )
    return f"memory per device {total}{limit} ({mem} {unit}{reserve})"


def _strategy_lines(plan: Plan) -> list[str]:
    """The strategies, grouped by layer: each distinct one with its count."""
    groups: dict[str, Counter] = {}
    for a in plan.operators:
        text = ",".join(f"{axis}:{dim or '-'}" for axis, dim in a.strategy)
        groups.setdefault(_group(a.name), Counter())[text] += 1
    lines = ["strategies (mesh axis: split dim, '-' replicated):"]
    for group, counts in groups.items():
        lines.append(
            f"  {group:32s} "
            + "; ".join(f"{s}" + (f" x{n}" if n > 1 else "") for s, n in counts.most_common())
        )
    return lines


def _layout_lines(result: Plan3D) -> list[str]:
    """The plan's configuration as one line: its degrees and each stage-mesh axis's role."""
    layout = result.layout
    if layout is None:
        return []
    axes = ", ".join(f"{a.name}={a.size} {a.role} on {a.level}" for a in layout.mesh_axes)
    return [
        f"layout: pp {layout.pipeline_degree} x dp {layout.data_parallel_degree} x tp "
        f"{layout.tensor_parallel_degree} ({axes}); micro-batch per replica "
        f"{layout.micro_batch_per_replica}"
    ]


def _bound_lines(result: Plan3D) -> list[str]:
    """The proven gap: the plan against the time no configuration of the space can beat."""
    if result.gap is None:
        return []
    return [
        f"lower bound {result.lower_bound_s:.3f} s per iteration for any configuration of the 3D "
        f"space (every operator's compute spread over all devices, no communication or bubble): "
        f"this plan is at most {result.gap:.1%} from the optimum"
    ]


def format_3d(result: Plan3D) -> str:
    """A 3D plan: pipeline, per-stage time and memory, stage plan, and the candidates compared."""
    pipe = result.pipeline
    limit = f" of {bytes_text(result.memory_limit_bytes)}" if result.memory_limit_bytes else ""
    lines = [
        f"3D plan for {result.model} on mesh {result.mesh} ({result.device}): {result.status}",
        f"{pipe.stages} pipeline stages of mesh {result.stage_mesh}, {pipe.num_microbatches} "
        f"micro-batches of {pipe.micro_batch} ({pipe.schedule}, cuts by {pipe.method}: "
        f"{pipe.status}); stage plan by {result.intra_method}: {result.intra_status}",
        f"estimated iteration time {pipe.iteration_time_s:.3f} s (bottleneck stage "
        f"{pipe.bottleneck_s * 1e3:.2f} ms); max memory per device "
        f"{bytes_text(pipe.max_memory_bytes)}{limit} "
        f"({'fits' if pipe.fits_memory else 'does not fit'})",
        f"stage cuts (first layer of stages 1..p-1): {list(pipe.cuts)}",
        f"settings: recompute {_recompute_text(result.settings)}, zero {result.settings.zero}, "
        "sequence "
        f"parallel {'on' if result.settings.sequence_parallel else 'off'}; linear layers split: "
        + ", ".join(f"{a}:{d or '-'}" for a, d in result.tensor_parallel_dims),
        *_layout_lines(result),
        *_bound_lines(result),
        f"search time {result.search_time_s:.2f} s",
        *(f"note: {note}" for note in result.notes),
        *_memory_parts_lines(result),
    ]
    if result.candidates:
        lines.append(
            "candidates (stages, stage mesh, stage plan, sequence parallel, recompute, zero, M, s, "
            "GiB, fits):"
        )
        for c in result.candidates:
            lines.append(
                f"  {c['stages']:4d} {c['stage_mesh']:18s} {c.get('stage_plan', '-'):8s} "
                f"{'sp' if c['sequence_parallel'] else '-':2s} {c['recompute']:9s} {c['zero']} "
                f"{c['num_microbatches']:5d} {c['iteration_time_s']:10.3f} "
                f"{c['max_memory_bytes'] / GIB:8.2f} {c['fits_memory']}"
            )
    return "\n".join(lines)


def _memory_parts_lines(result: Plan3D) -> list[str]:
    """Per stage, its time per micro-batch and its memory per device by part (GiB): model state
    (weights, gradients, optimizer state), the activations of the micro-batches in flight (their
    count; of which the loss's logits), the working set (one layer's re-run under recompute or
    the loss's backward buffers), a tied copy."""
    lines = [
        "per stage: time per micro-batch (ms); memory per device (GiB) = weights + grads + "
        "optimizer + activations (x micro-batches in flight; of which logits) + working set "
        "(a layer's re-run or the loss's backward) + tied copy"
    ]
    details = result.stage_details or [None] * len(result.stage_times_s)
    for k, (t, m, d) in enumerate(zip(result.stage_times_s, result.stage_memory_bytes, details)):
        line = f"  stage {k:3d} {t * 1e3:10.3f} ms {m / GIB:8.2f} GiB"
        if d is not None:
            line += (
                f" = {d.params_bytes / GIB:.2f} + {d.grads_bytes / GIB:.2f} + "
                f"{d.optimizer_bytes / GIB:.2f} + {d.activations_bytes / GIB:.2f} "
                f"(x{d.inflight_microbatches:g}; {d.logits_bytes / GIB:.2f}) + "
                f"{d.working_bytes / GIB:.2f} + {d.tied_bytes / GIB:.2f}"
            )
        lines.append(line)
    if result.reserve_bytes:
        lines.append(
            f"reserve per device (CUDA context, NCCL buffers, workspaces; not in the figures "
            f"above): {result.reserve_bytes / GIB:.2f} GiB"
            + (
                ", already taken from the device's memory for the budget"
                if result.memory_limit_bytes
                else ""
            )
        )
    return lines


def emit(text: str, args: argparse.Namespace) -> None:
    """Print the report unless --quiet; a closed stdout (``| head``) ends the printing quietly."""
    if args.quiet:
        return
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout at exit


def check_picture(args: argparse.Namespace) -> tuple[str, str] | None:
    """(path, format) of --png or --svg, or None; a bad name refused before any work or file."""
    path, fmt = (args.png, "png") if args.png is not None else (args.svg, "svg")
    if path is None:
        return None
    if not str(path).lower().endswith(f".{fmt}") and not str(path).startswith("/dev/"):
        raise SettingsError(
            f"--{fmt}: {path!r} does not end in .{fmt} (the file is written as {fmt.upper()})"
        )
    return path, fmt


def write_picture(args: argparse.Namespace, make) -> None:
    """Draw a figure (``make(draw module)``) into --png or --svg, when one is given."""
    picture = check_picture(args)
    if picture is None:
        return
    path, fmt = picture

    write_bytes(path, draw.figure_bytes(make(draw), fmt), f"--{fmt}")


def _recompute_text(settings) -> str:
    """The recompute mode, or the per-layer modes given (Megatron-LM's block recompute) as the
    layers each mode covers."""
    if not settings.layer_recompute:
        return settings.recompute
    counts: dict[str, int] = {}
    for _, mode in settings.layer_recompute:
        counts[mode] = counts.get(mode, 0) + 1
    return "per layer (" + ", ".join(f"{mode} on {n}" for mode, n in counts.items()) + " layers)"
