"""The tables of a costed problem: one per operator (its strategies with integer cost and memory)
and one per edge (a tensor's redistribution cost per layout pair, and per tied read), with the
conversion of seconds and bytes to the integer program's units."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.cluster.mesh import Mesh
from planner.cluster.profiles import MachineProfile
from planner.cost.operands import OperandInfo
from planner.cost.records import CostRecord
from planner.cost.redistribution import edge_seconds
from planner.cost.strategy import Layout, Strategy, forward_layout
from planner.cost.terms import tied_reads
from planner.errors import SettingsError
from planner.ir.graph import Graph, Operator


@dataclass(frozen=True, slots=True, eq=False)
class OpTable:
    """One operator's candidate strategies with integer cost and memory (bytes) each."""

    op: Operator
    inputs: tuple[OperandInfo, ...]
    strategies: tuple[Strategy, ...]
    cost: np.ndarray
    memory: np.ndarray
    out_layouts: tuple[tuple[Layout, ...], ...]  # [strategy][output slot]
    in_layouts: tuple[tuple[Layout, ...], ...]  # [strategy][input slot]
    records: tuple[CostRecord, ...] = ()  # the symbolic cost of each strategy


@dataclass(frozen=True, slots=True, eq=False)
class EdgeTable:
    """A tensor from a producer output slot to a consumer input slot, costed per layout pair."""

    tensor: str
    src: int
    src_slot: int
    dst: int
    dst_slot: int
    src_layouts: tuple[Layout, ...]
    dst_layouts: tuple[Layout, ...]
    cost: np.ndarray  # [len(src_layouts), len(dst_layouts)]
    src_index: np.ndarray  # producer strategy -> row
    dst_index: np.ndarray  # consumer strategy -> column


MAX_UNITS = 2**50  # per term (13 days in ns, 1 PiB): int64 sums over many terms must not overflow


def to_units(value_s: float, unit_s: float) -> int:
    units = value_s / unit_s
    if not units < MAX_UNITS:  # also catches inf and NaN
        raise SettingsError(
            f"--seq/--batch: a cost of {value_s:.3g} s does not fit the integer objective "
            f"({unit_s:g} s units); the model or the profile is out of range (shrink the model's "
            "batch or sequence, or the shapes of its graph file; check the profile's bandwidth "
            "and latency)"
        )
    return int(round(units))


def to_bytes(value: float) -> int:
    if not value < MAX_UNITS:
        raise SettingsError(
            f"--seq/--batch: {value:.3g} bytes per device do not fit the integer program; the "
            "model is out of range (shrink its batch or sequence, or the shapes of its graph file)"
        )
    return int(round(value))


def layout_index(layouts: Sequence[Layout]) -> tuple[tuple[Layout, ...], np.ndarray]:
    distinct = tuple(sorted(set(layouts)))
    position = {lay: i for i, lay in enumerate(distinct)}
    return distinct, np.array([position[lay] for lay in layouts], dtype=np.int64)


def build_edges(
    graph: Graph,
    tables: list[OpTable],
    mesh: Mesh,
    profile: MachineProfile,
    unit_s: float,
    passes: int = 1,
    matrix_cache: dict | None = None,
) -> tuple[EdgeTable, ...]:
    """One table per edge: the redistribution of its tensor in each pass (forward and backward,
    ``passes`` micro-batches a step). ``matrix_cache`` keeps the matrices for the next build on
    the same mesh (another setting's problem: redistribution does not depend on the settings);
    its keys hold the mesh, unit and passes, so one cache may serve several meshes."""
    position = {t.op.name: i for i, t in enumerate(tables)}
    out_slot = {
        o.tensor: (position[t.op.name], k) for t in tables for k, o in enumerate(t.op.outputs)
    }
    matrix_cache = {} if matrix_cache is None else matrix_cache
    where = (mesh, unit_s, passes)
    index_cache: dict[tuple, tuple] = {}

    def indexed(layouts: tuple, slot: int) -> tuple:
        key = (id(layouts), slot)  # op tables of identical operators share their layout tuples
        if key not in index_cache:
            index_cache[key] = (layouts, layout_index([lay[slot] for lay in layouts]))
        return index_cache[key][1]

    edges = []
    for dst, table in enumerate(tables):
        for slot, operand in enumerate(table.op.inputs):
            if operand.tensor not in out_slot:
                continue  # parameters and data inputs: no producer
            src, src_slot = out_slot[operand.tensor]
            info = table.inputs[slot]
            src_layouts, src_index = indexed(tables[src].out_layouts, src_slot)
            dst_layouts, dst_index = indexed(table.in_layouts, slot)
            key = (*where, info.shape, info.elem_bytes, info.edge_grad, src_layouts, dst_layouts)
            if key not in matrix_cache:
                matrix_cache[key] = _edge_matrix(
                    info, src_layouts, dst_layouts, mesh, unit_s, passes
                )
            ends = (src, src_slot, dst, slot, src_layouts, dst_layouts)
            edges.append(EdgeTable(operand.tensor, *ends, matrix_cache[key], src_index, dst_index))
    return tuple(edges)


def _edge_matrix(
    info: OperandInfo, src_layouts, dst_layouts, mesh: Mesh, unit_s: float, passes: int = 1
):
    """Redistribution cost (integer units) of a tensor from each producer to each reader layout."""
    return np.array(
        [
            [
                to_units(
                    edge_seconds(info.shape, info.elem_bytes, a, b, mesh, info.edge_grad) * passes,
                    unit_s,
                )
                for b in dst_layouts
            ]
            for a in src_layouts
        ],
        dtype=np.int64,
    )


def build_ties(
    graph: Graph, tables: list[OpTable], mesh: Mesh, unit_s: float, passes: int = 1
) -> tuple[EdgeTable, ...]:
    """One edge table per tied read: owner's forward layout of the parameter -> the reader's."""
    infos = {t.op.name: t.inputs for t in tables}
    ties = []
    for owner, owner_slot, reader, slot in tied_reads(graph, infos):
        info = tables[reader].inputs[slot]
        src_layouts, src_index = layout_index(
            [forward_layout(lay[owner_slot]) for lay in tables[owner].in_layouts]
        )
        dst_layouts, dst_index = layout_index(
            [forward_layout(lay[slot]) for lay in tables[reader].in_layouts]
        )
        # = seconds(tie_cost(...))
        cost = np.array(
            [
                [
                    to_units(
                        edge_seconds(info.shape, info.elem_bytes, a, b, mesh, True) * passes, unit_s
                    )
                    for b in dst_layouts
                ]
                for a in src_layouts
            ],
            dtype=np.int64,
        )
        ties.append(
            EdgeTable(
                graph.operators[reader].inputs[slot].tensor,
                owner,
                owner_slot,
                reader,
                slot,
                src_layouts,
                dst_layouts,
                cost,
                src_index,
                dst_index,
            )
        )
    return tuple(ties)
