"""What the cost model predicts an engine sends: every collective of a plan (flat or 3D), as the
bytes each device puts on the wire, per mesh axis, so that XLA's compiled collectives and PyTorch's
counted ones can be compared with it (``compare``). Engine-neutral: imports neither torch nor JAX.

The prediction is the plan's cost record under float32 and SGD without ZeRO (what the checked
steps do). Both sides are compared as the bytes each device sends (the bandwidth term of the
cost model: (p-1)/p n per collective, twice for an all-reduce), in total and per mesh axis, so an
all-reduce equals the reduce-scatter + all-gather pair that moves the same bytes (the CPU backend
emits all-reduce where a GPU may emit that pair). A collective whose replica group spans several
mesh axes is attributed to them as its hierarchical equivalent (see ``wire_bytes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cluster.mesh import Mesh
from planner.cluster.profiles import SYMBOLIC
from planner.cost.collectives import PER_MICROBATCH, bytes_sent
from planner.cost.operators import output_layouts
from planner.cost.records import sum_records
from planner.cost.settings import TrainingSettings
from planner.cost.strategy import Strategy, shard_factor
from planner.cost.terms import plan_terms
from planner.engines.export import export_plan
from planner.ir.crossing import crossing_tensors, stages_reading
from planner.ir.graph import Graph
from planner.pipeline.layer_costs import send_split

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


Transfer = tuple[str, tuple[str, ...], float]  # (kind, mesh axes in mesh order, n bytes)


def predicted_collectives(
    graph: Graph,
    strategies: dict[str, Strategy],
    mesh: Mesh,
    settings: TrainingSettings = VERIFY_SETTINGS,
) -> list[Transfer]:
    """Every collective the cost model charges for the plan (fp32, SGD, no ZeRO unless
    ``settings``)."""
    terms = plan_terms(
        graph, mesh, SYMBOLIC, settings, [strategies[op.name] for op in graph.operators]
    )
    record = sum_records(terms.records())
    return [
        (c.kind, (mesh.names[c.axis],), c.nbytes)
        for c in record.comm
        if c.axis >= 0 and c.nbytes > 0
    ]


def predicted_pipeline_collectives(
    micro: Graph,
    stage_of: dict[str, int],
    strategies: dict[str, Strategy],
    mesh: Mesh,
    stages: int,
    num_microbatches: int,
    settings: TrainingSettings = VERIFY_SETTINGS,
) -> list[Transfer]:
    """What the 3D cost model charges one device of each stage in one step, summed over the stages:
    the stage plan's terms (forward and backward once per micro-batch, the gradient sync once; an
    edge runs on its consumer's stage), each crossing tensor sent forward and its gradient sent back
    per micro-batch (``p2p`` on ``pp``, a device's share by ``send_split``), and the all-reduce of
    the copies of a parameter read on several stages (``tied``)."""
    chosen = [strategies[op.name] for op in micro.operators]
    terms = plan_terms(micro, mesh, SYMBOLIC, settings, chosen)
    out: list[Transfer] = []
    for record in terms.records():
        out += [
            (
                c.kind,
                (mesh.names[c.axis],),
                c.nbytes * (num_microbatches if c.phase in PER_MICROBATCH else 1),
            )
            for c in record.comm
            if c.axis >= 0 and c.nbytes > 0
        ]
    made = {o.tensor: (op, k) for op in micro.operators for k, o in enumerate(op.outputs)}
    for names in crossing_tensors(micro, stage_of, stages):
        for name in names:
            op, k = made[name]
            share = (
                math.prod(micro.tensor(name).shape)
                * settings.elem_bytes
                / send_split(output_layouts(op, strategies[op.name])[k], mesh)
            )
            out.append(("p2p", ("pp",), 2 * num_microbatches * share))
    # where each copy is kept: its first reader's layout
    leaves = dict(export_plan(micro, strategies, mesh).leaves)
    for name, readers in stages_reading(micro, stage_of).items():
        if len(readers) > 1:
            layout = leaves[name]
            nbytes = (
                math.prod(micro.tensor(name).shape)
                * settings.grad_bytes
                / shard_factor(layout, mesh.shape)
            )
            out += [("all_reduce", ("tied",), nbytes)] * len(readers)
    return out


def wire_bytes(
    kind: str, axes: tuple[str, ...], nbytes: float, sizes: dict[str, int]
) -> dict[str, float]:
    """Bytes one device sends, per mesh axis: (p-1)/p n, twice for an all-reduce, n for p2p.

    A collective over several axes (one flat replica group) is attributed as its hierarchical
    equivalent, which sends the same bytes in total: all-reduce and all-gather run outer to inner
    with the buffer on axis j = n / (product of the axes inside j); reduce-scatter and all-to-all
    inner to outer, buffer n / (product of the axes outside j). This is the order the cost model
    uses (``planner.cost.collectives.hierarchical_all_reduce`` and
    ``planner.cost.redistribution``)."""
    if kind == "p2p":  # XLA's collective-permute: every byte leaves the device
        return {"+".join(axes) or "none": nbytes}
    out = {}
    for j, axis in enumerate(axes):
        others = axes[j + 1 :] if kind in ("all_reduce", "all_gather") else axes[:j]
        buffer = nbytes / math.prod(sizes[a] for a in others)
        out[axis] = bytes_sent(kind, sizes[axis], buffer)
    return out


def compare(
    predicted: list[Transfer], compiled: list[Transfer], sizes: dict[str, int]
) -> tuple[tuple[Comparison, ...], tuple]:
    """Sent bytes compared in total and per mesh axis; n bytes per kind (for information)."""

    def per_axis(transfers: list[Transfer]) -> dict[str, float]:
        acc: dict[str, float] = {}
        for kind, axes, n in transfers:
            for axis, value in wire_bytes(kind, axes, n, sizes).items():
                acc[axis] = acc.get(axis, 0.0) + value
        return acc

    want, got = per_axis(predicted), per_axis(compiled)
    rows = [Comparison("total", sum(want.values()), sum(got.values()))]
    rows += [
        Comparison(axis, want.get(axis, 0.0), got.get(axis, 0.0))
        for axis in sorted(set(want) | set(got))
    ]
    kinds = sorted({k for k, _, _ in predicted} | {k for k, _, _ in compiled})
    by_kind = tuple(
        (k, sum(n for kk, _, n in predicted if kk == k), sum(n for kk, _, n in compiled if kk == k))
        for k in kinds
    )
    return tuple(rows), by_kind
