"""Verify a plan without GPUs (``planner verify``): the numpy executor against the unsharded
forward, and the collectives an engine ran (XLA's compiled step, PyTorch's counted one) against the
cost model's prediction (``planner.engines.predicted``: bytes each device sends, in total and per
mesh axis), with an estimate of the memory the checks need before any of them starts.
Engine-neutral: the engines' runs are passed in by the caller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from planner.errors import SettingsError
from planner.ir.graph import Graph
from planner.cluster.mesh import Mesh
from planner.cost.operators import output_layouts
from planner.cost.strategy import Strategy, shard_factor
from planner.engines.predicted import Comparison, Transfer, compare, predicted_collectives
from planner.engines.executor import check_plan

XLA_COMPILER_BYTES = 0.5e9
NUMPY_BYTES = 16  # per element: float64 values, about twice over at the executor's peak
XLA_BYTES = 4  # per element of every device's block: float32


@dataclass(frozen=True, slots=True)
class VerifyReport:
    numpy_max_rel_error: float | None
    comparisons: tuple[Comparison, ...]  # 'total' first, then each axis
    by_kind: tuple[tuple[str, float, float], ...]  # (kind, predicted n bytes, compiled n bytes)
    compiled_count: int
    tolerance: float
    numeric_tolerance: float
    # PyTorch's collectives (CommDebugMode), 'total' first
    torch_comparisons: tuple[Comparison, ...] = ()

    @property
    def numpy_ok(self) -> bool:
        return (
            self.numpy_max_rel_error is None or self.numpy_max_rel_error <= self.numeric_tolerance
        )

    @property
    def xla_ok(self) -> bool:
        return all(c.rel_error <= self.tolerance for c in self.comparisons)

    @property
    def torch_ok(self) -> bool:
        return all(c.rel_error <= self.tolerance for c in self.torch_comparisons)

    @property
    def ok(self) -> bool:
        return self.numpy_ok and self.xla_ok and self.torch_ok


def estimate_memory(
    graph: Graph, strategies: dict[str, Strategy], mesh: Mesh, run_numpy: bool, run_xla: bool
) -> tuple[float, float]:
    """Upper estimate of the bytes the checks hold at once, as (total, part that does not scale with
    the batch). The two checks run one after the other, so the total is the larger of the two.
    The numpy executor keeps every tensor unsharded (float64 reference) and every device's block
    of it under the plan's layout, about twice over at its peak (measured: transformer-block at
    batch 2 on 8 devices, 6.9 GB against 16 bytes x elements); the XLA check compiles one step
    (float32) in a subprocess: one copy of every device's blocks and about 0.5 GB for XLA itself."""
    layout_of = {}
    for op in graph.operators:
        for o, layout in zip(op.outputs, output_layouts(op, strategies[op.name])):
            layout_of[o.tensor] = layout
    devices = mesh.num_devices
    numpy_bytes = xla_bytes = fixed = 0.0
    for t in graph.tensors:
        factor = shard_factor(layout_of.get(t.name, ()), mesh.shape) if t.name in layout_of else 1
        spread = t.numel * devices / factor  # elements over all devices
        numpy_bytes += NUMPY_BYTES * (t.numel + spread)
        xla_bytes += XLA_BYTES * spread
        if t.role == "param":
            fixed += NUMPY_BYTES * (t.numel + spread) if run_numpy else XLA_BYTES * spread
    total = max(
        numpy_bytes if run_numpy else 0.0, (xla_bytes + XLA_COMPILER_BYTES) if run_xla else 0.0
    )
    return total, fixed


RUN_BYTES = 4 * 3  # a training run: float32 values, their gradients and autograd's saved copies
# one rank's interpreter, torch or JAX and the process group, measured at rest
PROCESS_BYTES = 0.4e9


def estimate_run_memory(
    graph: Graph, strategies: dict[str, Strategy], mesh: Mesh, processes: int
) -> float:
    """Upper estimate of the bytes a ``run-torch`` / ``run-jax`` training run holds at once: every
    device's blocks of every tensor (values, gradients, saved activations in float32), the
    one-process reference on whole tensors alike, and each process's own footprint."""
    layout_of = {
        o.tensor: layout
        for op in graph.operators
        for o, layout in zip(op.outputs, output_layouts(op, strategies[op.name]))
    }
    spread = sum(
        t.numel
        * mesh.num_devices
        / (shard_factor(layout_of[t.name], mesh.shape) if t.name in layout_of else 1)
        for t in graph.tensors
    )
    whole = sum(t.numel for t in graph.tensors)
    return RUN_BYTES * (spread + whole) + PROCESS_BYTES * (processes + 1)


def check_run_memory(
    graph: Graph,
    strategies: dict[str, Strategy],
    mesh: Mesh,
    processes: int,
    limit: float | None = None,
) -> float:
    """Refuse a training run (``SettingsError``, one line with the estimate) that would need more
    than ``limit`` bytes (default: half the available memory), before any process starts."""
    limit = limit if limit is not None else available_memory() / 2
    total = estimate_run_memory(graph, strategies, mesh, processes)
    if total > limit:
        raise SettingsError(
            f"--max-memory: the training run needs about {total / 1e9:.1f} GB, more than the limit "
            f"of {limit / 1e9:.1f} GB; try a smaller --batch or model configuration (or raise "
            "--max-memory)"
        )
    return total


def check_memory(
    graph: Graph,
    strategies: dict[str, Strategy],
    mesh: Mesh,
    run_numpy: bool,
    run_xla: bool,
    limit: float | None = None,
) -> float:
    """Refuse (``SettingsError``, one line) when the estimate exceeds ``limit`` (default: half the
    available memory); the message gives the estimate and a batch that would fit."""
    limit = limit if limit is not None else available_memory() / 2
    total, fixed = estimate_memory(graph, strategies, mesh, run_numpy, run_xla)
    if total <= limit:
        return total
    batch = graph.batch_size
    scale = (limit - fixed) / max(total - fixed, 1.0)
    hint = (
        f"try --batch {max(1, int(batch * scale))} or a shorter --seq"
        if scale > 0 and int(batch * scale) >= 1
        else "the parameters alone exceed it: use a smaller model configuration"
    )
    raise SettingsError(
        f"--max-memory: the checks need about {total / 1e9:.1f} GB, more than the limit of "
        f"{limit / 1e9:.1f} GB; {hint} (or raise --max-memory)"
    )


def available_memory() -> float:
    """MemAvailable from /proc/meminfo (Linux), else the physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def verify_plan(
    graph: Graph,
    strategies: dict[str, Strategy],
    mesh: Mesh,
    *,
    run_numpy: bool = True,
    compiled: Sequence[Transfer] | None = None,
    counted: Sequence[Comparison] = (),
    tolerance: float = 0.05,
    numeric_tolerance: float = 1e-5,
) -> VerifyReport:
    """The report of the checks that ran; see the module docstring. ``compiled``: the collectives of
    the XLA-compiled step (``planner.engines.jax.xla.compiled_collectives``), compared here with the
    prediction; ``counted``: the comparison rows of a PyTorch run (CommDebugMode's counts,
    ``TrainRun.counted_comparison``). The engines run in the caller
    (``planner.runs.verify_loaded``), so this module imports neither."""
    numpy_error = None
    if run_numpy:
        numpy_error = max(check_plan(graph, strategies, mesh).values())
    comparisons, by_kind = (), ()
    if compiled is not None:
        comparisons, by_kind = compare(
            predicted_collectives(graph, strategies, mesh),
            list(compiled),
            dict(zip(mesh.names, mesh.shape)),
        )
    return VerifyReport(
        numpy_error,
        comparisons,
        by_kind,
        len(compiled or ()),
        tolerance,
        numeric_tolerance,
        tuple(counted),
    )


def format_report(report: VerifyReport) -> str:
    lines = []
    if report.numpy_max_rel_error is not None:
        verdict = "ok" if report.numpy_ok else "MISMATCH"
        lines.append(
            f"numpy executor: max relative error {report.numpy_max_rel_error:.2e} (tolerance "
            f"{report.numeric_tolerance:g}) {verdict}"
        )
    if report.comparisons:
        lines.append(
            f"XLA: {report.compiled_count} collectives compiled; bytes sent per device, predicted "
            "vs compiled:"
        )
        lines.append(f"  {'axes':12s} {'predicted':>14s} {'compiled':>14s} {'rel err':>8s}")
        for c in report.comparisons:
            verdict = "ok" if c.rel_error <= report.tolerance else "MISMATCH"
            lines.append(
                f"  {c.axes:12s} {c.predicted:14,.0f} {c.compiled:14,.0f} {c.rel_error:8.2%} "
                f"{verdict}"
            )
        lines.append(
            "  by kind (n bytes): "
            + ", ".join(f"{k} {p:,.0f} / {x:,.0f}" for k, p, x in report.by_kind)
        )
    if report.torch_comparisons:
        lines.append(
            "PyTorch (gloo, DTensor): collectives counted by CommDebugMode; bytes sent per "
            "device, predicted vs counted:"
        )
        for c in report.torch_comparisons:
            verdict = "ok" if c.rel_error <= report.tolerance else "MISMATCH"
            lines.append(
                f"  {c.axes:12s} {c.predicted:14,.0f} {c.compiled:14,.0f} {c.rel_error:8.2%} "
                f"{verdict}"
            )
    return "\n".join(lines)
