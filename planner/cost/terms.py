"""The one walk over a plan: every operator's and every edge's cost record.

The plan report, ``evaluate``, the heuristics' final costing, the pipeline layer chains and the
verification all sum these terms (tests/test_costing.py checks that they agree on random graphs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from planner.cost.operands import operand_infos, signature_ids
from planner.cost.operators import input_layouts, op_cost, op_costs, output_layouts
from planner.cost.records import CostRecord, sum_records
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
    walk = _Walk(graph, mesh, profile, settings, strategies)
    op_terms, edge_terms = [], []
    for i, reads in enumerate(input_producers(graph)):
        given = op_records[i] if op_records is not None else None
        op_terms.append(walk.op_record(i) if given is None else given)
        edge_terms += [(src, i, slot, walk.edge_record(i, slot, src, k)) for slot, src, k in reads]
    tie_terms = _tie_terms(graph, walk.infos, walk.layouts, walk.kid, mesh, walk.edges)
    return PlanTerms(tuple(op_terms), tuple(edge_terms), tuple(tie_terms))


def layer_sums(
    graph: Graph,
    mesh: Mesh,
    profile: MachineProfile,
    settings: TrainingSettings,
    strategies: Sequence[Strategy],
    layer: Sequence[int],
    n: int,
) -> tuple[list[CostRecord], list[CostRecord]]:
    """Every operator's record, and per position 0..n-1 (``layer[i]``: operator i's) the sum of
    its operators' records and of the records of the edges into them (``plan_terms``' terms, in
    its order). Positions with the same operators, strategies and incoming edges are summed once:
    the identical layers of a model are walked as one."""
    walk = _Walk(graph, mesh, profile, settings, strategies)
    reads, kid = input_producers(graph), walk.kid
    members: list[list[int]] = [[] for _ in range(n)]
    for i, position in enumerate(layer):
        members[position].append(i)
    summed: dict[tuple, CostRecord] = {}
    sums = []
    for ops in members:
        key = tuple((kid[i], tuple((slot, kid[src], k) for slot, src, k in reads[i])) for i in ops)
        if key not in summed:
            terms = [walk.op_record(i) for i in ops] + [
                walk.edge_record(i, slot, src, k) for i in ops for slot, src, k in reads[i]
            ]
            summed[key] = sum_records(terms)
        sums.append(summed[key])
    return [walk.op_record(i) for i in range(len(kid))], sums


class _Walk:
    """One plan's walk state: each distinct (signature, strategy) gets a small id, and its layouts
    and record are computed once; an edge's record is keyed by its ends' ids and slots (the walk
    hashes ints, not layouts)."""

    def __init__(self, graph: Graph, mesh: Mesh, profile, settings, strategies) -> None:
        self.graph, self.mesh, self.profile, self.settings = graph, mesh, profile, settings
        self.strategies = strategies
        self.infos = operand_infos(graph, settings)
        ids: dict[tuple, int] = {}
        self.kid = [
            ids.setdefault(key, len(ids)) for key in zip(signature_ids(graph, settings), strategies)
        ]
        self.keys = list(ids)  # (signature id, strategy) of each id
        self.memo = op_costs(graph, mesh, profile, settings)
        self.layouts: list = [None] * len(ids)
        self.records: list = [None] * len(ids)
        for op, strategy, k in zip(graph.operators, strategies, self.kid):
            if self.layouts[k] is None:
                operands = self.infos[op.name]
                self.layouts[k] = (
                    output_layouts(op, strategy),
                    input_layouts(op, strategy, operands),
                )
        self.edges: dict[tuple, CostRecord] = {}

    def op_record(self, i: int) -> CostRecord:
        k = self.kid[i]
        if self.records[k] is None:
            key = self.keys[k]
            if key not in self.memo:
                op = self.graph.operators[i]
                self.memo[key] = op_cost(
                    op, key[1], self.mesh, self.settings, self.infos[op.name], self.profile
                )
            self.records[k] = self.memo[key]
        return self.records[k]

    def edge_record(self, i: int, slot: int, src: int, k: int) -> CostRecord:
        key = (self.kid[src], k, self.kid[i], slot)
        if key not in self.edges:
            info = self.infos[self.graph.operators[i].name][slot]
            self.edges[key] = edge_cost(
                info.shape,
                info.elem_bytes,
                self.layouts[self.kid[src]][0][k],
                self.layouts[self.kid[i]][1][slot],
                self.mesh.shape,
                info.edge_grad,
            )
        return self.edges[key]


def input_producers(graph: Graph) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """Per operator, (input slot, producer op, producer's output slot) of each input an operator
    makes (graph inputs have no edge): a fact of the graph, built once."""

    def build():
        producer = {
            o.tensor: (i, k)
            for i, op in enumerate(graph.operators)
            for k, o in enumerate(op.outputs)
        }
        return tuple(
            tuple(
                (slot, *producer[o.tensor])
                for slot, o in enumerate(op.inputs)
                if o.tensor in producer
            )
            for op in graph.operators
        )

    return graph.derived(("input_producers",), build)


def _tie_terms(graph: Graph, infos, layouts: list, keys: list, mesh: Mesh, cache: dict) -> list:
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
