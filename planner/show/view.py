"""What a picture of a plan shows, read from a plan JSON (flat or 3D) into frozen records.

Every figure and table of ``planner show`` is drawn from a ``PlanView``; each field is checked
when it is first needed, so a plan JSON from an earlier release either draws or fails with one
line naming the missing field (``SettingsError``, exit 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from planner.errors import SettingsError
from planner.pipeline.schedule import parse_schedule
from planner.pipeline.timeline import StageDetail, simulate
from planner.plan_files import check_plan_data, read_plan_file

MAX_BLOCKS = 50_000  # blocks of one simulated iteration that show draws (the time grows with them)
MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "working", "tied")
# dim letters by family (README, Concepts): colours of the sharding map
DIM_FAMILIES = (
    ("batch", "b"),
    ("sequence", "st"),
    ("heads", "ag"),
    ("ffn", "f"),
    ("vocab", "v"),
    ("hidden", "hd"),
    ("experts", "ex"),
)


@dataclass(frozen=True, slots=True)
class OperatorRow:
    name: str
    kind: str
    layer: int | None
    stage: int | None
    strategy: tuple[str | None, ...]  # dim split by each mesh axis of ``PlanView.axes``


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """Consecutive layers (or the operators outside the layers) that share one strategy per
    operator."""

    label: str
    layers: tuple[int, ...]
    # (operator name relative to its layer, strategy)
    rows: tuple[tuple[str, tuple[str | None, ...]], ...]


@dataclass(frozen=True, slots=True)
class PlanView:
    """A plan as its pictures need it. ``stages`` is empty for an intra-operator-only plan."""

    path: str
    model: str
    mesh: str
    device: str
    axes: tuple[str, ...]
    step_time_s: float
    memory_limit_bytes: float | None
    data: dict  # the JSON, read lazily by the properties below (fields checked where used)

    @property
    def is_3d(self) -> bool:
        return "pipeline" in self.data

    def field(
        self,
        name: str,
        kind: type | tuple = (int, float),
        where: dict | None = None,
        label: str = "",
    ) -> Any:
        where = self.data if where is None else where
        value = where.get(name)
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise SettingsError(
                f"--plan: {self.path}: field '{label or name}' is missing or malformed (a plan "
                "from an earlier release? write it again with planner plan --json)"
            )
        return value

    def stages(self) -> tuple[StageDetail, ...]:
        """Per-stage terms of a 3D plan."""
        rows = self.field("stages", list)
        names = [f for f in StageDetail.__slots__ if f != "stage"]
        return tuple(
            StageDetail(k, *(self.field(n, (int, float), row, f"stages[{k}].{n}") for n in names))
            for k, row in enumerate(rows)
        )

    def pipeline(self) -> tuple[str, int, int]:
        """(schedule, stages, micro-batches) of a 3D plan."""
        pipe = self.field("pipeline", dict)
        return (
            self.field("schedule", str, pipe, "pipeline.schedule"),
            self.field("stages", int, pipe, "pipeline.stages"),
            self.field("num_microbatches", int, pipe, "pipeline.num_microbatches"),
        )

    def timeline(self) -> tuple:
        """The simulated iteration of a 3D plan (``planner.pipeline.timeline.simulate``), refused
        when it has more blocks than ``MAX_BLOCKS``: drawing and simulating grow with them."""
        schedule, stages, count = self.pipeline()
        blocks = 2 * stages * count * parse_schedule(schedule)[1]
        if blocks > MAX_BLOCKS:
            raise SettingsError(
                f"--what: the schedule of {count} micro-batches on {stages} stages ({schedule}) "
                f"has {blocks:,} blocks, more than {MAX_BLOCKS:,} to draw; show --what memory or "
                "--what sharding"
            )
        return simulate(self.stages(), schedule, count, float(self.data.get("tied_sync_s", 0.0)))

    def comm_parts(self) -> tuple[tuple[str, float], ...]:
        """Communication seconds of a flat plan per 'kind axis' (per kind when the plan predates
        that field)."""
        pairs = self.data.get("comm_by_kind_axis_s")
        if isinstance(pairs, list):
            return tuple((f"{p['kind']} {p['axis']}", float(p["seconds"])) for p in pairs)
        return tuple((k, float(v)) for k, v in self.field("comm_by_kind_s", dict).items())

    def flat_memory(self) -> tuple[tuple[str, float], ...]:
        parts = self.field("memory_breakdown_bytes", dict)
        return tuple((name, float(parts.get(name, 0.0))) for name in MEMORY_PARTS if name in parts)

    def stage_memory(self) -> list[tuple[tuple[str, float], ...]]:
        """Per stage (one for a flat plan): memory per device by part."""
        if not self.is_3d:
            return [self.flat_memory()]
        return [
            tuple((name, getattr(d, f"{name}_bytes")) for name in MEMORY_PARTS)
            for d in self.stages()
        ]

    def operators(self) -> tuple[OperatorRow, ...]:
        rows = []
        for i, entry in enumerate(self.field("operators", list)):
            label = f"operators[{i}]"
            strategy = self.field("strategy", dict, entry, f"{label}.strategy")
            if "layer" not in entry:
                self.field("layer", int, entry, f"{label}.layer")
            layer = entry["layer"]
            if layer is not None and not isinstance(layer, int):
                self.field("layer", int, entry, f"{label}.layer")
            rows.append(
                OperatorRow(
                    str(entry["name"]),
                    str(entry.get("kind", "")),
                    layer,
                    entry.get("stage"),
                    tuple(strategy.get(axis) for axis in self.axes),
                )
            )
        return tuple(rows)

    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """Operators folded by layer: consecutive layers with identical strategies form one group;
        operators outside the layers form one group before and one after."""
        ops = self.operators()
        layers = sorted({op.layer for op in ops if op.layer is not None})
        by_layer = {
            layer: tuple(
                (relative_name(op.name, layer), op.strategy) for op in ops if op.layer == layer
            )
            for layer in layers
        }
        first = next((i for i, op in enumerate(ops) if op.layer is not None), len(ops))
        before = tuple((op.name, op.strategy) for op in ops[:first] if op.layer is None)
        after = tuple((op.name, op.strategy) for op in ops[first:] if op.layer is None)
        groups = [LayerGroup("before the layers", (), before)] if before else []
        for layer in layers:
            last = groups[-1] if groups and groups[-1].layers else None
            if last is not None and last.layers[-1] == layer - 1 and last.rows == by_layer[layer]:
                groups[-1] = LayerGroup(
                    _layers_label(last.layers + (layer,)), last.layers + (layer,), last.rows
                )
            else:
                groups.append(LayerGroup(_layers_label((layer,)), (layer,), by_layer[layer]))
        if after:
            groups.append(LayerGroup("after the layers", (), after))
        return tuple(groups)


def relative_name(name: str, layer: int) -> str:
    """An operator's name with its layer number replaced by '*' (h3.attn.qkv -> h*.attn.qkv)."""
    return re.sub(rf"(?<!\d){layer}(?!\d)", "*", name, count=1)


def _layers_label(layers: tuple[int, ...]) -> str:
    return (
        f"layer {layers[0]}"
        if len(layers) == 1
        else f"layers {layers[0]}-{layers[-1]} ({len(layers)} identical)"
    )


def dim_family(dim: str | None) -> str:
    """The colour family of a split dim: batch, sequence, heads, ffn, vocab, hidden, experts, other
    or replicate."""
    if dim is None:
        return "replicate"
    return next((family for family, letters in DIM_FAMILIES if dim in letters), "other")


def load_view(path: str) -> PlanView:
    """Read a plan JSON written by ``planner plan --json`` (flat or 3D) for ``planner show``."""
    return view_of(read_plan_file(path), str(path))


def view_of(data: dict, where: str = "plan") -> PlanView:
    """A view of a plan's dict (``Plan.to_dict()``, ``Plan3D.to_dict()`` or a plan JSON read
    back)."""
    data = check_plan_data(data, where)
    view = PlanView(
        where,
        str(data.get("model", "?")),
        data["mesh"],
        str(data.get("device", "?")),
        (),
        0.0,
        None,
        data,
    )
    first = data["operators"][0]["strategy"] if data["operators"] else {}
    # every operator names the (stage-)mesh axes
    axes = tuple(first) if isinstance(first, dict) else ()
    step = view.field("iteration_time_s" if "pipeline" in data else "estimated_step_time_s")
    limit = data.get("memory_limit_bytes")
    return PlanView(
        where,
        view.model,
        view.mesh,
        view.device,
        axes,
        float(step),
        float(limit) if isinstance(limit, (int, float)) else None,
        data,
    )
