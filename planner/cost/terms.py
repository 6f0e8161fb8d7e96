"""The one walk over a plan: every operator's and every edge's cost record.

The plan report, ``evaluate``, the heuristics' final costing, the pipeline layer chains and the
verification all sum these terms (tests/test_costing.py checks that they agree on random graphs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from planner.cost.operators import (
    input_layouts,
    op_cost,
    operand_infos,
    output_layouts,
    signature_ids,
)
from planner.cost.records import CostRecord
from planner.cost.redistribution import edge_cost
from planner.cost.settings import TrainingSettings
from planner.ir.graph import Graph
from planner.cluster.mesh import Mesh
from planner.cluster.profiles import MachineProfile
from planner.cost.strategy import Layout, Strategy, forward_layout


@dataclass(frozen=True, slots=True)
class PlanTerms:
    """Every cost term of a plan: one record per operator and one per edge (producer -> consumer).

    ``edges`` holds ``(producer op index, consumer op index, input slot, record)``. This is the one
    walk over a plan; the plan report, ``evaluate``, the heuristics' final costing, the pipeline
    layer chains and the verification all sum these terms."""

    ops: tuple[CostRecord, ...]
    edges: tuple[tuple[int, int, int, CostRecord], ...]
    # (owner op, reader op, reader's slot, record)
    ties: tuple[tuple[int, int, int, CostRecord], ...] = ()

    def records(self) -> list[CostRecord]:
        """Every term: operators, edges and ties."""
        return (
            list(self.ops)
            + [record for *_, record in self.edges]
            + [record for *_, record in self.ties]
        )


def tied_reads(graph: Graph, infos) -> tuple[tuple[int, int, int, int], ...]:
    """(owner op, owner's slot, reader op, reader's slot) of each parameter read by several
    operators.

    A tied parameter (GPT's embedding table, read again by the LM head) is stored once, in the
    layout its owner (the first reader, which keeps its state) reads it in; another reader that
    needs it in another layout redistributes it from there in each forward pass: a tie edge, costed
    like an activation edge from the owner's layout (its gradient, already reduced by the reader's
    own
    gradient all-reduce, is then sliced to the owner's layout locally)."""

    def build():
        owner: dict[str, tuple[int, int]] = {}
        out = []
        for i, op in enumerate(graph.operators):
            for slot, info in enumerate(infos[op.name]):
                if info.role == "param" and info.counts_memory:
                    owner[op.inputs[slot].tensor] = (i, slot)
        for i, op in enumerate(graph.operators):
            for slot, info in enumerate(infos[op.name]):
                home = owner.get(op.inputs[slot].tensor)
                if info.role == "param" and home is not None and home[0] != i:
                    out.append((home[0], home[1], i, slot))
        return tuple(out)

    # the owner is the first reader, whatever the settings
    return graph.derived(("tie_edges",), build)


def tie_cost(
    shape: tuple[int, ...],
    elem_bytes: int,
    owner_layout: Layout,
    reader_layout: Layout,
    mesh_shape: tuple[int, ...],
) -> CostRecord:
    """The tie edge between two readers' layouts of one parameter (see ``tied_reads``)."""
    return edge_cost(
        shape,
        elem_bytes,
        forward_layout(owner_layout),
        forward_layout(reader_layout),
        mesh_shape,
        True,
    )


def plan_terms(
    graph: Graph,
    mesh: Mesh,
    profile: MachineProfile,
    settings: TrainingSettings,
    strategies: Sequence[Strategy],
    op_records: Sequence[CostRecord | None] | None = None,
) -> PlanTerms:
    """Cost every operator and every edge of a plan (one strategy per operator, graph order).

    ``op_records`` may carry records already computed for some operators (a problem's tables);
    identical operators (same signature and strategy) and identical edges (same shape and
    layouts) are costed once."""
    infos = operand_infos(graph, settings)
    producer = {
        o.tensor: (i, k) for i, op in enumerate(graph.operators) for k, o in enumerate(op.outputs)
    }
    keys = list(zip(signature_ids(graph, settings), strategies))
    # per key: (output layouts, input layouts); identical ops share them
    layouts: dict[tuple, tuple] = {}
    for key, op, strategy in zip(keys, graph.operators, strategies):
        if key not in layouts:
            layouts[key] = (
                output_layouts(op, strategy),
                input_layouts(op, strategy, infos[op.name]),
            )
    op_terms, edge_terms = [], []
    cache: dict[tuple, CostRecord] = {}
    op_cache: dict[tuple, CostRecord] = {}
    for i, (op, strategy, key) in enumerate(zip(graph.operators, strategies, keys)):
        given = op_records[i] if op_records is not None else None
        if given is None:
            if key not in op_cache:
                op_cache[key] = op_cost(op, strategy, mesh, settings, infos[op.name], profile)
            given = op_cache[key]
        op_terms.append(given)
        ins = layouts[key][1]
        for slot, operand in enumerate(op.inputs):
            if operand.tensor not in producer:
                continue
            src, k = producer[operand.tensor]
            info, out = infos[op.name][slot], layouts[keys[src]][0][k]
            edge = (info.shape, info.elem_bytes, info.edge_grad, out, ins[slot])
            if edge not in cache:
                cache[edge] = edge_cost(
                    info.shape, info.elem_bytes, out, ins[slot], mesh.shape, info.edge_grad
                )
            edge_terms.append((src, i, slot, cache[edge]))
    tie_terms = _tie_terms(graph, infos, layouts, keys, mesh, cache)
    return PlanTerms(tuple(op_terms), tuple(edge_terms), tuple(tie_terms))


def _tie_terms(graph: Graph, infos, layouts: dict, keys: list, mesh: Mesh, cache: dict) -> list:
    """One term per tied read: the owner's layout of the parameter against the reader's."""
    tie_terms = []
    for owner, owner_slot, reader, slot in tied_reads(graph, infos):
        info = infos[graph.operators[reader].name][slot]
        pair = (layouts[keys[owner]][1][owner_slot], layouts[keys[reader]][1][slot])
        tie = (info.shape, info.elem_bytes, "tie") + pair
        if tie not in cache:
            cache[tie] = tie_cost(info.shape, info.elem_bytes, *pair, mesh.shape)
        tie_terms.append((owner, reader, slot, cache[tie]))
    return tie_terms
