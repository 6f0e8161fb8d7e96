"""The one walk over a plan: every operator's and every edge's cost record.

The plan report, ``evaluate``, the heuristics' final costing, the pipeline layer chains and the
verification all sum these terms (tests/test_costing.py checks that they agree on random graphs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from planner.cost.operators import input_layouts, op_cost, operand_infos, output_layouts, signature_ids
from planner.cost.records import CostRecord
from planner.cost.redistribution import edge_cost
from planner.cost.settings import TrainingSettings
from planner.ir.graph import Graph
from planner.cluster.mesh import Mesh
from planner.cluster.profiles import MachineProfile
from planner.cost.strategy import Strategy


@dataclass(frozen=True, slots=True)
class PlanTerms:
    """Every cost term of a plan: one record per operator and one per edge (producer -> consumer).

    ``edges`` holds ``(producer op index, consumer op index, input slot, record)``. This is the one
    walk over a plan; the plan report, ``evaluate``, the heuristics' final costing, the pipeline
    layer chains and the verification all sum these terms."""

    ops: tuple[CostRecord, ...]
    edges: tuple[tuple[int, int, int, CostRecord], ...]


def plan_terms(graph: Graph, mesh: Mesh, profile: MachineProfile, settings: TrainingSettings,
               strategies: Sequence[Strategy], op_records: Sequence[CostRecord | None] | None = None) -> PlanTerms:
    """Cost every operator and every edge of a plan (one strategy per operator, graph order).

    ``op_records`` may carry records already computed for some operators (a problem's tables);
    identical operators (same signature and strategy) and identical edges (same shape and
    layouts) are costed once."""
    infos = operand_infos(graph, settings)
    producer = {o.tensor: (i, k) for i, op in enumerate(graph.operators) for k, o in enumerate(op.outputs)}
    keys = list(zip(signature_ids(graph, settings), strategies))
    layouts: dict[tuple, tuple] = {}  # per key: (output layouts, input layouts); identical ops share them
    for key, op, strategy in zip(keys, graph.operators, strategies):
        if key not in layouts:
            layouts[key] = (output_layouts(op, strategy), input_layouts(op, strategy, infos[op.name]))
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
                cache[edge] = edge_cost(info.shape, info.elem_bytes, out, ins[slot], mesh.shape, info.edge_grad)
            edge_terms.append((src, i, slot, cache[edge]))
    return PlanTerms(tuple(op_terms), tuple(edge_terms))
