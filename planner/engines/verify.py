"""Verify a plan without GPUs: the numpy executor against the unsharded forward, and XLA's compiled
collectives against the cost model's prediction (``planner verify``; DESIGN section 8).

The prediction is the plan's cost record under float32 and SGD without ZeRO (what the compiled
step does). Both sides are compared as the bytes each device sends (the bandwidth term of the
cost model: (p-1)/p n per collective, twice for an all-reduce), in total and per mesh axis, so an
all-reduce equals the reduce-scatter + all-gather pair that moves the same bytes (the CPU backend
emits all-reduce where a GPU may emit that pair). A collective whose replica group spans several
mesh axes is attributed to them as its hierarchical equivalent (see ``wire_bytes``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from planner.cost.collectives import bytes_sent
from planner.cost.operators import output_layouts
from planner.cost.records import sum_records
from planner.cost.settings import TrainingSettings
from planner.cost.terms import plan_terms
from planner.errors import SettingsError
from planner.ir.graph import Graph
from planner.cluster.mesh import Mesh
from planner.cluster.profiles import SYMBOLIC
from planner.cost.strategy import Strategy, shard_factor

XLA_COMPILER_BYTES = 0.5e9
NUMPY_BYTES = 16  # per element: float64 values, about twice over at the executor's peak
XLA_BYTES = 4  # per element of every device's block: float32

VERIFY_SETTINGS = TrainingSettings(dtype="fp32", optimizer="sgd", zero=0, recompute=False)


@dataclass(frozen=True, slots=True)
class Comparison:
    """Predicted against compiled traffic (bytes) for one mesh axis, or 'total'."""

    axes: str
    predicted: float
    compiled: float

    @property
    def rel_error(self) -> float:
        if self.predicted == 0:
            return 0.0 if self.compiled == 0 else float("inf")
        return abs(self.compiled - self.predicted) / self.predicted


@dataclass(frozen=True, slots=True)
class VerifyReport:
    numpy_max_rel_error: float | None
    comparisons: tuple[Comparison, ...]  # 'total' first, then each axis
    by_kind: tuple[tuple[str, float, float], ...]  # (kind, predicted n bytes, compiled n bytes)
    compiled_count: int
    tolerance: float
    numeric_tolerance: float
    torch_comparisons: tuple[Comparison, ...] = ()  # PyTorch's collectives (CommDebugMode), 'total' first

    @property
    def numpy_ok(self) -> bool:
        return self.numpy_max_rel_error is None or self.numpy_max_rel_error <= self.numeric_tolerance

    @property
    def xla_ok(self) -> bool:
        return all(c.rel_error <= self.tolerance for c in self.comparisons)

    @property
    def torch_ok(self) -> bool:
        return all(c.rel_error <= self.tolerance for c in self.torch_comparisons)

    @property
    def ok(self) -> bool:
        return self.numpy_ok and self.xla_ok and self.torch_ok


Transfer = tuple[str, tuple[str, ...], float]  # (kind, mesh axes in mesh order, n bytes)


def predicted_collectives(graph: Graph, strategies: dict[str, Strategy], mesh: Mesh,
                          settings: TrainingSettings = VERIFY_SETTINGS) -> list[Transfer]:
    """Every collective the cost model charges for the plan (fp32, SGD, no ZeRO unless ``settings``)."""
    terms = plan_terms(graph, mesh, SYMBOLIC, settings, [strategies[op.name] for op in graph.operators])
    record = sum_records(terms.records())
    return [(c.kind, (mesh.names[c.axis],), c.nbytes) for c in record.comm if c.axis >= 0 and c.nbytes > 0]


def predicted_pipeline_collectives(micro: Graph, stage_of: dict[str, int], strategies: dict[str, Strategy],
                                   mesh: Mesh, stages: int, num_microbatches: int,
                                   settings: TrainingSettings = VERIFY_SETTINGS) -> list[Transfer]:
    """What the 3D cost model charges one device of each stage in one step, summed over the stages:
    the stage plan's terms (forward and backward once per micro-batch, the gradient sync once; an
    edge runs on its consumer's stage), each crossing tensor sent forward and its gradient sent back
    per micro-batch (``p2p`` on ``pp``, a device's share by ``send_split``), and the all-reduce of
    the copies of a parameter read on several stages (``tied``)."""
    from planner.engines.export import export_plan
    from planner.engines.torch_pipeline import stages_reading
    from planner.ir.crossing import crossing_tensors
    from planner.pipeline.layer_costs import send_split
    chosen = [strategies[op.name] for op in micro.operators]
    terms = plan_terms(micro, mesh, SYMBOLIC, settings, chosen)
    out: list[Transfer] = []
    for record in terms.records():
        out += [(c.kind, (mesh.names[c.axis],), c.nbytes * (num_microbatches if c.phase in ("fwd", "bwd") else 1))
                for c in record.comm if c.axis >= 0 and c.nbytes > 0]
    made = {o.tensor: (op, k) for op in micro.operators for k, o in enumerate(op.outputs)}
    for names in crossing_tensors(micro, stage_of, stages):
        for name in names:
            op, k = made[name]
            share = math.prod(micro.tensor(name).shape) * settings.elem_bytes / send_split(
                output_layouts(op, strategies[op.name])[k], mesh)
            out.append(("p2p", ("pp",), 2 * num_microbatches * share))
    leaves = dict(export_plan(micro, strategies, mesh).leaves)  # where each copy is kept: its first reader's layout
    for name, readers in stages_reading(micro, stage_of).items():
        if len(readers) > 1:
            layout = leaves[name]
            nbytes = math.prod(micro.tensor(name).shape) * settings.grad_bytes / shard_factor(layout, mesh.shape)
            out += [("all_reduce", ("tied",), nbytes)] * len(readers)
    return out


def wire_bytes(kind: str, axes: tuple[str, ...], nbytes: float, sizes: dict[str, int]) -> dict[str, float]:
    """Bytes one device sends, per mesh axis: (p-1)/p n, twice for an all-reduce, n for p2p.

    A collective over several axes (one flat replica group) is attributed as its hierarchical
    equivalent, which sends the same bytes in total: all-reduce and all-gather run outer to inner
    with the buffer on axis j = n / (product of the axes inside j); reduce-scatter and all-to-all
    inner to outer, buffer n / (product of the axes outside j). This is the order the cost model
    uses (``planner.cost.collectives.hierarchical_all_reduce`` and ``planner.cost.redistribution``)."""
    if kind == "p2p":  # XLA's collective-permute: every byte leaves the device
        return {"+".join(axes) or "none": nbytes}
    out = {}
    for j, axis in enumerate(axes):
        others = axes[j + 1:] if kind in ("all_reduce", "all_gather") else axes[:j]
        buffer = nbytes / math.prod(sizes[a] for a in others)
        out[axis] = bytes_sent(kind, sizes[axis], buffer)
    return out


def compare(predicted: list[Transfer], compiled: list[Transfer], sizes: dict[str, int]) -> tuple[tuple[Comparison, ...], tuple]:
    """Sent bytes compared in total and per mesh axis; n bytes per kind (for information)."""
    def per_axis(transfers: list[Transfer]) -> dict[str, float]:
        acc: dict[str, float] = {}
        for kind, axes, n in transfers:
            for axis, value in wire_bytes(kind, axes, n, sizes).items():
                acc[axis] = acc.get(axis, 0.0) + value
        return acc
    want, got = per_axis(predicted), per_axis(compiled)
    rows = [Comparison("total", sum(want.values()), sum(got.values()))]
    rows += [Comparison(axis, want.get(axis, 0.0), got.get(axis, 0.0)) for axis in sorted(set(want) | set(got))]
    kinds = sorted({k for k, _, _ in predicted} | {k for k, _, _ in compiled})
    by_kind = tuple((k, sum(n for kk, _, n in predicted if kk == k), sum(n for kk, _, n in compiled if kk == k))
                    for k in kinds)
    return tuple(rows), by_kind


def estimate_memory(graph: Graph, strategies: dict[str, Strategy], mesh: Mesh, run_numpy: bool,
                    run_xla: bool) -> tuple[float, float]:
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
    total = max(numpy_bytes if run_numpy else 0.0, (xla_bytes + XLA_COMPILER_BYTES) if run_xla else 0.0)
    return total, fixed


RUN_BYTES = 4 * 3  # a training run: float32 values, their gradients and autograd's saved copies
PROCESS_BYTES = 0.4e9  # one rank's interpreter, torch or JAX and the process group, measured at rest


def estimate_run_memory(graph: Graph, strategies: dict[str, Strategy], mesh: Mesh, processes: int) -> float:
    """Upper estimate of the bytes a ``run-torch`` / ``run-jax`` training run holds at once: every
    device's blocks of every tensor (values, gradients, saved activations in float32), the
    one-process reference on whole tensors alike, and each process's own footprint."""
    layout_of = {o.tensor: layout for op in graph.operators
                 for o, layout in zip(op.outputs, output_layouts(op, strategies[op.name]))}
    spread = sum(t.numel * mesh.num_devices / (shard_factor(layout_of[t.name], mesh.shape)
                                               if t.name in layout_of else 1) for t in graph.tensors)
    whole = sum(t.numel for t in graph.tensors)
    return RUN_BYTES * (spread + whole) + PROCESS_BYTES * (processes + 1)


def check_run_memory(graph: Graph, strategies: dict[str, Strategy], mesh: Mesh, processes: int,
                     limit: float | None = None) -> float:
    """Refuse a training run (``SettingsError``, one line with the estimate) that would need more
    than ``limit`` bytes (default: half the available memory), before any process starts."""
    limit = limit if limit is not None else available_memory() / 2
    total = estimate_run_memory(graph, strategies, mesh, processes)
    if total > limit:
        raise SettingsError(f"--max-memory: the training run needs about {total / 1e9:.1f} GB, more than the "
                            f"limit of {limit / 1e9:.1f} GB; try a smaller --batch or model configuration "
                            "(or raise --max-memory)")
    return total


def check_memory(graph: Graph, strategies: dict[str, Strategy], mesh: Mesh, run_numpy: bool, run_xla: bool,
                 limit: float | None = None) -> float:
    """Refuse (``SettingsError``, one line) when the estimate exceeds ``limit`` (default: half the
    available memory); the message gives the estimate and a batch that would fit."""
    limit = limit if limit is not None else available_memory() / 2
    total, fixed = estimate_memory(graph, strategies, mesh, run_numpy, run_xla)
    if total <= limit:
        return total
    batch = graph.batch_size
    scale = (limit - fixed) / max(total - fixed, 1.0)
    hint = (f"try --batch {max(1, int(batch * scale))} or a shorter --seq" if scale > 0 and int(batch * scale) >= 1
            else "the parameters alone exceed it: use a smaller model configuration")
    raise SettingsError(f"--max-memory: the checks need about {total / 1e9:.1f} GB, more than the limit of "
                        f"{limit / 1e9:.1f} GB; {hint} (or raise --max-memory)")


def available_memory() -> float:
    """MemAvailable from /proc/meminfo (Linux), else the physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def verify_plan(graph: Graph, strategies: dict[str, Strategy], mesh: Mesh, *, run_numpy: bool = True,
                run_xla: bool = True, tolerance: float = 0.05, numeric_tolerance: float = 1e-5,
                timeout_s: float = 600.0, run_torch: bool = False) -> VerifyReport:
    """Run the checks that are asked for; see the module docstring. ``run_torch``: one training step
    on gloo processes (``planner.engines.train_torch``), DTensor's collectives counted by CommDebugMode."""
    numpy_error = None
    if run_numpy:
        from planner.engines.executor import check_plan
        numpy_error = max(check_plan(graph, strategies, mesh).values())
    comparisons, by_kind, count = (), (), 0
    if run_xla:
        from planner.engines.xla import compiled_collectives
        compiled, _ = compiled_collectives(graph, strategies, mesh.names, mesh.shape, timeout_s)
        transfers = [(c.kind, c.axes, c.nbytes) for c in compiled]
        comparisons, by_kind = compare(predicted_collectives(graph, strategies, mesh), transfers,
                                       dict(zip(mesh.names, mesh.shape)))
        count = len(compiled)
    counted = ()
    if run_torch:
        from planner.engines.train_torch import train_on_torch
        run = train_on_torch(graph, strategies, mesh.names, mesh.shape, steps=1, timeout_s=timeout_s)
        counted = run.counted_comparison(graph, strategies, mesh)
    return VerifyReport(numpy_error, comparisons, by_kind, count, tolerance, numeric_tolerance, counted)


def format_report(report: VerifyReport) -> str:
    lines = []
    if report.numpy_max_rel_error is not None:
        verdict = "ok" if report.numpy_ok else "MISMATCH"
        lines.append(f"numpy executor: max relative error {report.numpy_max_rel_error:.2e} "
                     f"(tolerance {report.numeric_tolerance:g}) {verdict}")
    if report.comparisons:
        lines.append(f"XLA: {report.compiled_count} collectives compiled; bytes sent per device, predicted vs compiled:")
        lines.append(f"  {'axes':12s} {'predicted':>14s} {'compiled':>14s} {'rel err':>8s}")
        for c in report.comparisons:
            verdict = "ok" if c.rel_error <= report.tolerance else "MISMATCH"
            lines.append(f"  {c.axes:12s} {c.predicted:14,.0f} {c.compiled:14,.0f} {c.rel_error:8.2%} {verdict}")
        lines.append("  by kind (n bytes): " + ", ".join(f"{k} {p:,.0f} / {x:,.0f}" for k, p, x in report.by_kind))
    if report.torch_comparisons:
        lines.append("PyTorch (gloo, DTensor): collectives counted by CommDebugMode; bytes sent per device, predicted vs counted:")
        for c in report.torch_comparisons:
            verdict = "ok" if c.rel_error <= report.tolerance else "MISMATCH"
            lines.append(f"  {c.axes:12s} {c.predicted:14,.0f} {c.compiled:14,.0f} {c.rel_error:8.2%} {verdict}")
    return "\n".join(lines)
