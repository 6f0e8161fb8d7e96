"""The costed problem: per operator its valid strategies with integer costs, per edge a layout
table.

Every search method (brute force, CP-SAT, the decomposition, the heuristics) works on this one
object, so differences between methods come from the search alone.

Integer units: a cost in seconds becomes ``round(seconds / unit_s)`` with ``unit_s = 1e-9`` by
default (1 ns; under the ``symbolic`` profile 1 unit = 1 byte). Every term is rounded once, so the
integer objective of a plan differs from its float time by at most (number of terms) * unit / 2;
all exact methods optimise the same integer objective, so they agree to the integer unit.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from planner.cost.operands import OperandInfo, operand_infos, signature_ids
from planner.cost.operators import input_layouts, op_cost, op_costs, output_layouts
from planner.cost.records import CostRecord, accumulated, sum_records, seconds
from planner.cost.settings import TrainingSettings
from planner.cost.terms import plan_terms
from planner.errors import SettingsError
from planner.ir.graph import Graph, Operator
from planner.cluster.mesh import Mesh
from planner.cluster.profiles import MachineProfile
from planner.cost.strategy import enumerate_strategies, splittable_dims

from planner.cost.tables import EdgeTable, OpTable, build_edges, build_ties, to_bytes, to_units

DEFAULT_UNIT_S = 1e-9


@dataclass(frozen=True, slots=True, eq=False)
class Problem:
    """A graph costed on a cluster: its operator tables (in graph order) and edge tables, the costs
    in integer multiples of ``unit_s`` seconds."""

    graph: Graph
    ops: tuple[OpTable, ...]
    edges: tuple[EdgeTable, ...]
    mesh: Mesh
    profile: MachineProfile
    settings: TrainingSettings
    unit_s: float
    _producer_index: dict = field(default_factory=dict, repr=False)
    # tie edges: owner op -> another reader of a parameter (``tied_reads``)
    ties: tuple[EdgeTable, ...] = ()
    # (owner op, layouts of its tied parameters) a conditioned copy is pinned to
    conditions: tuple = ()
    # micro-batches a step accumulates (the graph is one micro-batch): the passes' costs repeat,
    # the gradient sync and optimizer step do not (``records.accumulated``)
    num_microbatches: int = 1
    # the edge matrices built so far, shared with the problems ``rebuilt`` from this one
    edge_matrices: dict = field(default_factory=dict, repr=False)
    # id(table) -> (table, content digest): shared with the copies ``replace`` makes (restricted,
    # conditioned), which reuse most tables, so a segment's hash reads each table's bytes once
    digests: dict = field(default_factory=dict, repr=False)

    @property
    def all_edges(self) -> tuple[EdgeTable, ...]:
        """Edges and tie edges: every pairwise term of the objective."""
        return self.edges + self.ties

    def op_index(self, name: str) -> int:
        for i, table in enumerate(self.ops):
            if table.op.name == name:
                return i
        raise KeyError(name)

    def producer_layout_index(self, tensor: str) -> np.ndarray:
        """For the producer of ``tensor``: its strategy -> index of the tensor's layout (edge
        rows)."""
        if not self._producer_index:
            for e in self.edges:
                self._producer_index.setdefault(e.tensor, e.src_index)
        return self._producer_index[tensor]

    def producer_layout_count(self, tensor: str) -> int:
        """How many layouts the producer of ``tensor`` may give it (rows of its edges' tables)."""
        return next(len(e.src_layouts) for e in self.edges if e.tensor == tensor)

    def objective(self, choice: Sequence[int]) -> int:
        """Integer objective of a choice of strategy index per operator."""
        total = sum(int(t.cost[c]) for t, c in zip(self.ops, choice))
        for e in self.all_edges:
            total += int(e.cost[e.src_index[choice[e.src]], e.dst_index[choice[e.dst]]])
        return total

    def memory(self, choice: Sequence[int]) -> int:
        return sum(int(t.memory[c]) for t, c in zip(self.ops, choice))

    def record(self, choice: Sequence[int]) -> CostRecord:
        """The symbolic cost record of a whole plan, a step of all its micro-batches (for
        breakdowns)."""
        strategies = [t.strategies[c] for t, c in zip(self.ops, choice)]
        terms = plan_terms(
            self.graph,
            self.mesh,
            self.profile,
            self.settings,
            strategies,
            [t.records[c] for t, c in zip(self.ops, choice)],
        )
        return accumulated(sum_records(terms.records()), self.num_microbatches)


def _build_op_table(
    op: Operator,
    infos: tuple[OperandInfo, ...],
    mesh: Mesh,
    profile: MachineProfile,
    settings: TrainingSettings,
    unit_s: float,
    passes: int = 1,
    memo: tuple[dict, int] | None = None,
) -> OpTable:
    """The op's table of strategies; ``memo``: the graph's ``op_costs`` and the op's signature id
    (records computed once per graph, mesh and settings, shared with the plans re-costed there)."""
    candidates = []
    for strategy in enumerate_strategies(op, mesh):
        if memo is None:
            record = op_cost(op, strategy, mesh, settings, infos, profile)
        else:
            known, sid = memo
            record = known.get((sid, strategy))
            if record is None:
                record = known[sid, strategy] = op_cost(
                    op, strategy, mesh, settings, infos, profile
                )
        signature = (output_layouts(op, strategy), input_layouts(op, strategy, infos))
        candidates.append(
            (
                signature,
                to_units(seconds(accumulated(record, passes), mesh, profile), unit_s),
                to_bytes(record.memory.total),
                strategy,
                record,
            )
        )
    kept = _prune_dominated(candidates)
    return OpTable(
        op,
        infos,
        tuple(c[3] for c in kept),
        np.array([c[1] for c in kept], dtype=np.int64),
        np.array([c[2] for c in kept], dtype=np.int64),
        tuple(c[0][0] for c in kept),
        tuple(c[0][1] for c in kept),
        tuple(c[4] for c in kept),
    )


def _prune_dominated(candidates: list[tuple]) -> list[tuple]:
    """Drop a strategy when another has the same layouts everywhere and no more cost nor memory.

    Edge costs depend on layouts only, so such a strategy can never be needed by an optimum.
    """
    by_signature: dict[tuple, list[int]] = {}
    for k, c in enumerate(candidates):
        by_signature.setdefault(c[0], []).append(k)
    kept = set()
    for group in by_signature.values():
        for k in group:
            cost, memory = candidates[k][1], candidates[k][2]
            # beaten: another is no worse in both and strictly better in one, or equal and listed
            # earlier
            if not any(
                candidates[j][1] <= cost
                and candidates[j][2] <= memory
                and ((candidates[j][1], candidates[j][2]) != (cost, memory) or j < k)
                for j in group
                if j != k
            ):
                kept.add(k)
    return [c for k, c in enumerate(candidates) if k in kept]


# per edge; measured: gpt2-small on 2x2x2x2 (390,625) costs in 73 s on one core
MAX_LAYOUT_PAIRS = 500_000
SLOW_LAYOUT_PAIRS = 50_000


def check_size(graph: Graph, mesh: Mesh) -> None:
    """Refuse, before any work, a mesh on which the strategy tables would take too long to cost.

    Bound per operator: every axis picks nothing or one splittable dim that its size divides;
    an edge costs every (producer layout, consumer layout) pair, at most the square of that."""
    worst, name = 1, ""
    for op in graph.operators:
        sizes, dims = op.sizes, splittable_dims(op)
        bound = math.prod(
            1 + sum(sizes[d] % axis.size == 0 for d in dims) if axis.size > 1 else 1
            for axis in mesh.axes
        )
        if bound > worst:
            worst, name = bound, op.name
    if worst * worst > MAX_LAYOUT_PAIRS:
        raise SettingsError(
            f"--mesh: {mesh.spec} gives operator {name} up to {worst:,} strategies (up to "
            f"{worst * worst:,} layout pairs per edge, more than {MAX_LAYOUT_PAIRS:,}); use fewer "
            "mesh axes (merge axes, e.g. 8x8x8 -> 8x64) or a smaller model"
        )
    if worst * worst > SLOW_LAYOUT_PAIRS:
        logging.getLogger("planner").warning(
            "mesh %s: operator %s has up to %s strategies; costing the layout tables may take "
            "minutes",
            mesh.spec,
            name,
            f"{worst:,}",
        )


def build_problem(
    graph: Graph,
    mesh: Mesh,
    profile: MachineProfile,
    settings: TrainingSettings | None = None,
    unit_s: float = DEFAULT_UNIT_S,
    num_microbatches: int = 1,
    edge_matrices: dict | None = None,
) -> Problem:
    """Enumerate and cost every operator strategy and every edge layout pair; ``graph`` is one
    micro-batch of a step that accumulates ``num_microbatches`` of them. ``edge_matrices``: the
    redistribution matrices of earlier builds to reuse (``tables.build_edges``); the problem keeps
    the dict, filled, as its ``edge_matrices``."""
    check_size(graph, mesh)
    settings = settings or TrainingSettings()
    matrices = {} if edge_matrices is None else edge_matrices
    with _no_cycle_collection():
        return _build(graph, mesh, profile, settings, unit_s, num_microbatches, matrices)


def skeleton(
    graph: Graph, mesh: Mesh, profile: MachineProfile, settings: TrainingSettings
) -> Problem:
    """The problem's operators, mesh and settings without costed tables (no strategy, no edge):
    for the hand-written plans that read only those (``baselines.megatron``), where costing every
    strategy of every operator would be wasted."""
    empty = np.zeros(0, dtype=np.int64)
    tables = tuple(OpTable(op, (), (), empty, empty, (), ()) for op in graph.operators)
    return Problem(graph, tables, (), mesh, profile, settings, DEFAULT_UNIT_S)


def rebuilt(problem: Problem, settings: TrainingSettings) -> Problem:
    """The same graph, cluster, unit and micro-batch count under other settings (its edge
    matrices reused: redistribution does not depend on the settings)."""
    return build_problem(
        problem.graph,
        problem.mesh,
        problem.profile,
        settings,
        problem.unit_s,
        problem.num_microbatches,
        problem.edge_matrices,
    )


@contextlib.contextmanager
def _no_cycle_collection():
    """Costing allocates ~10^6 short-lived acyclic records that reference counting frees; the cycle
    collector would rescan every long-lived table each few hundred allocations (a quarter of the
    build time on large meshes), so it pauses here and resumes as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _build(
    graph: Graph,
    mesh: Mesh,
    profile: MachineProfile,
    settings: TrainingSettings,
    unit_s: float,
    passes: int,
    matrices: dict,
) -> Problem:
    infos = operand_infos(graph, settings)
    op_cache: dict[int, OpTable] = {}
    tables = []
    known = op_costs(graph, mesh, profile, settings)
    for op, key in zip(graph.operators, signature_ids(graph, settings)):
        if key not in op_cache:
            op_cache[key] = _build_op_table(
                op, infos[op.name], mesh, profile, settings, unit_s, passes, (known, key)
            )
        cached = op_cache[key]
        tables.append(
            OpTable(
                op,
                cached.inputs,
                cached.strategies,
                cached.cost,
                cached.memory,
                cached.out_layouts,
                cached.in_layouts,
                cached.records,
            )
        )
    edges = build_edges(graph, tables, mesh, profile, unit_s, passes, matrices)
    return Problem(
        graph,
        tuple(tables),
        edges,
        mesh,
        profile,
        settings,
        unit_s,
        ties=build_ties(graph, tables, mesh, unit_s, passes),
        num_microbatches=passes,
        edge_matrices=matrices,
    )
