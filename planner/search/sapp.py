"""SMSG's D-Rec as MindSpore ships it (SAPP, ``search_mode="recursive_programming"``), on the
planner's IR.

The facts are those of MindSpore 2.10's ``rec_core`` (cost rules, elimination, level loop,
propagation); the code is ours. One *level* halves the devices once; a node's decision at a level
is one op dim to halve (or none). Tensors are compared as 4-D (right-aligned, SAPP's NCHW padding).

    searched nodes   MatMul: a contraction with no dim common to inputs 0, 1 and the output (no
                     batch dim; a bias input may follow), C[i,j] = A[i,k] B[k,j]
                     with i, j, k the products of the local extents of those dim families;
                     Conv (batch cut only); pooling (first or second tensor dim); batch-parallel
                     types (BatchNorm, the loss) and one virtual-dataset node per data input
    eliminated       every other operator (elementwise, norms, softmax, views, reductions, gathers,
                     BatchMatMul): producers are rewired to consumers, input 0 as the main edge,
                     the other inputs as auxiliary edges
    levels           log2(D); each level visits the searched nodes in topological order, or by
                     weight (largest first, ties in topological order) when D > 32 (SAPP's
                     "micro-batch < 8" holds: there is no pipeline here)
    MatMul costs     cut i: j*k/2 * 0.1   cut j: i*k/2 (not once k is cut)
                     cut k: i*j/2 (not once j is cut)   no cut: min(i, j, k costs)^2 / 25
                     weight = the largest of the four
    Conv             cut n: |filter|/2      pooling: 0      batch-parallel: the first even dim,
                     no redistribution      virtual dataset: weight 0
    redistribution   + 16 * |local input 0| per decided producer (main or auxiliary) whose
                     one-level output halving differs from the candidate's on that input;
                     + 16 * |local output| per argument of a decided consumer with the output's
                     shape, when the consumer's one-level input-0 halving differs from the
                     candidate's output halving. Only neighbours decided at the current level
                     count, and only "adjacent" ones: the producer's shape, mapped through the
                     transposes and reshapes on the eliminated path, equals the input's shape.

A cut of a row family (i with several dims, e.g. ``b, s``) halves its first dim whose local
extent is even, as a contiguous split of the flattened rows would. ``Propagation``
(sapp_propagate.py) then gives the eliminated operators their splits, and ``to_mesh`` turns levels
into mesh axes.
"""

from __future__ import annotations

import math

from planner.cluster.mesh import Mesh
from planner.cost.problem import Problem
from planner.cost.strategy import Strategy
from planner.errors import SettingsError
from planner.ir.graph import Graph, Operator
from planner.search.baselines import drop_until_valid
from planner.search.sapp_graph import (
    CORES,
    EXPERT_COEF,
    MEM_COEF,
    REDIS_COEF,
    REPLICATE_BELOW,
    WEIGHT_ORDER_ABOVE,
    Levels,
    RecGraph,
    first_even,
    position4d,
)
from planner.search.sapp_propagate import Propagation


# ---------------------------------------------------------------- the level loop


def _numel(groups, local: dict[str, int]) -> int:
    return math.prod(local[d] for g in groups for d in g)


class _Search:
    """The per-level greedy partition of SAPP (``PartitionForAllDevices``)."""

    def __init__(self, rec: RecGraph, levels: int, weight_order: bool) -> None:
        self.rec = rec
        self.levels = levels
        self.weight_order = weight_order
        self.local = [dict(node.sizes) for node in rec.nodes]
        self.cuts: list[list[str | None]] = [[] for _ in rec.nodes]
        position = {op.name: i for i, op in enumerate(rec.graph.operators)}
        self.rank = [position[node.name] if node.op is not None else -1 for node in rec.nodes]

    def run(self) -> list[list[str | None]]:
        for _ in range(self.levels):
            # nodes decided at this level, and by the position their decision halves
            self.decided = 0
            self.out_at: dict[int, int] = {}
            self.in0_at: dict[int, int] = {}
            self.out_pos: dict[int, int] = {}
            for n in self._order():
                dim = self._decide(n)
                node, bit = self.rec.nodes[n], 1 << n
                self.decided |= bit
                self.out_pos[n] = position4d(node.output, dim)
                self.out_at[self.out_pos[n]] = self.out_at.get(self.out_pos[n], 0) | bit
                pos = position4d(node.inputs[0], dim)
                self.in0_at[pos] = self.in0_at.get(pos, 0) | bit
                self.cuts[n].append(dim)
                if dim is not None:
                    self.local[n][dim] //= 2
        return self.cuts

    def _order(self) -> list[int]:
        nodes = range(len(self.rec.nodes))
        if not self.weight_order:
            return sorted(nodes, key=lambda n: (self.rank[n], n))
        return sorted(nodes, key=lambda n: (-self._weight(n), self.rank[n], n))

    def _matmul_costs(self, n: int) -> tuple[float, ...]:
        """MatMul: cut i, j, k, no cut. BatchMatMul: cut b, x (SAPP's "expert" dim), i, j, k, no
        cut."""
        node, local = self.rec.nodes[n], self.local[n]
        i, j, k = (math.prod(local[d] for d in family) for family in node.families[:3])
        if node.role == "matmul":
            costs = (j * k / 2 * MEM_COEF, i * k / 2, i * j / 2)
            return costs + (min(costs) ** 2 / REPLICATE_BELOW,)
        halves = [
            _numel(groups, local) / 2 for groups in (node.inputs[0], node.inputs[1], node.output)
        ]
        batch = math.prod(local[d] for d in node.families[3] + node.families[4])
        ratio = CORES if batch == 1 else max(CORES / batch - 1, 0.0)
        least = EXPERT_COEF * min(halves)
        return (
            ratio * least,
            ratio * least - 1,
            halves[1],
            halves[0],
            halves[2],
            least * least / REPLICATE_BELOW,
        )

    def _weight(self, n: int) -> float:
        node = self.rec.nodes[n]
        if node.role in ("matmul", "bmm"):
            return max(self._matmul_costs(n))
        if node.role == "conv":
            return min(self._conv_costs(n))
        return math.inf if node.role == "batch" else 0.0

    def _conv_costs(self, n: int) -> tuple[float, ...]:
        node, local = self.rec.nodes[n], self.local[n]
        size_in, size_filter = (_numel(g, local) for g in node.inputs[:2])
        size_out = _numel(node.output, local)
        return (
            size_filter / 2,
            (size_in + size_filter) / 2,
            size_in / 2,
            (size_in + size_out) / 2,
            size_out / 2,
        )

    def _options(self, n: int) -> list[tuple[str | None, float]]:
        """(dim to halve or None, op cost) of each allowed candidate, in SAPP's order."""
        node, local = self.rec.nodes[n], self.local[n]
        if node.role in ("matmul", "bmm"):
            costs = self._matmul_costs(n)
            cut = {d for d in self.cuts[n] if d is not None}
            i_dims, j_dims, k_dims = node.families[:3]
            families = (
                ((node.families[3], True), (node.families[4], True)) if node.role == "bmm" else ()
            )
            families += (
                (i_dims, True),
                (j_dims, not cut & set(k_dims)),
                (k_dims, not cut & set(j_dims)),
            )
            dims = [
                first_even(family, local, node.whole) if allowed else None
                for family, allowed in families
            ]
            return [(d, c) for d, c in zip(dims, costs) if d is not None] + [(None, costs[-1])]
        if node.role == "conv":
            batch = first_even(node.inputs[0][0][:1], local, node.whole)
            return [(batch, self._conv_costs(n)[0])] if batch is not None else []
        # pooling: the first two dims of its 4-D input, no op cost
        dims = [first_even(group[:1], local, node.whole) for group in node.inputs[0][:2]]
        return [(d, 0.0) for d in dims if d is not None]

    def _decide(self, n: int) -> str | None:
        node = self.rec.nodes[n]
        if node.role in ("batch", "virtual"):  # first even dim; redistribution ignored
            return first_even([g[0] for g in node.inputs[0]], self.local[n], node.whole)
        options = [(abs(cost + self._redis(n, dim)), dim) for dim, cost in self._options(n)]
        # the first of the cheapest, as std::min_element; nothing to halve: not split at this level
        return min(options, key=lambda option: option[0])[1] if options else None

    def _redis(self, n: int, dim: str | None) -> float:
        """SAPP's ``CostRedis``: 16 x the tensor per adjacent neighbour decided at this level whose
        one-level halving differs (producers: their output against this input; consumers: their
        input 0 against this output)."""
        node, local, decided = self.rec.nodes[n], self.local[n], self.decided
        mismatched_in = 0
        for slot, (main, adjacent, aux) in enumerate(self.rec.sources[n]):
            mine = position4d(node.inputs[slot], dim)
            if main is not None and adjacent and decided >> main & 1 and self.out_pos[main] != mine:
                mismatched_in += 1
            if aux & decided:
                mismatched_in += (aux & decided).bit_count() - (
                    aux & decided & self.out_at.get(mine, 0)
                ).bit_count()
        cost = mismatched_in * _numel(node.inputs[0], local) * REDIS_COEF
        mine = position4d(node.output, dim)
        for same, mask in self.rec.consumers[n].items():
            if mask & decided:
                mismatched = (mask & decided).bit_count() - (
                    mask & decided & self.in0_at.get(mine, 0)
                ).bit_count()
                cost += same * mismatched * _numel(node.output, local) * REDIS_COEF
        return cost


# ---------------------------------------------------------------- levels -> mesh axes, public entry
# points


def level_axes(mesh: Mesh) -> tuple[int, ...]:
    """The mesh axis of each level: an axis of size 2^k takes k consecutive levels, innermost axis
    first."""
    owners: list[int] = []
    for ax in reversed(range(len(mesh.axes))):
        size = mesh.axes[ax].size
        if size & (size - 1):
            raise SettingsError(
                f"--mesh: sapp halves the devices, so every axis size must be a power of two; "
                f"{mesh.axes[ax].name} has {size}"
            )
        owners.extend([ax] * (size.bit_length() - 1))
    return tuple(owners)


def sapp_levels(
    graph: Graph, num_devices: int, order: str = "auto", search_batch_matmul: bool = False
) -> list[Levels]:
    """Per graph operator, the dim each level halves (None: not split at that level).

    ``order``: ``topological``, ``weight`` or ``auto`` (weight order above 32 devices, as SAPP).
    ``search_batch_matmul``: search BatchMatMuls with their own cost (SAPP's dynamic-shape mode)
    instead of eliminating them (MindSpore 2.10's static-shape default).
    """
    if num_devices < 1 or num_devices & (num_devices - 1):
        raise SettingsError(f"--mesh: sapp needs a power-of-two device count, got {num_devices}")
    if order not in ("auto", "topological", "weight"):
        raise SettingsError(f"order: expected auto, topological or weight, got {order!r}")
    levels = num_devices.bit_length() - 1
    weight_order = order == "weight" or (order == "auto" and num_devices > WEIGHT_ORDER_ABOVE)
    # in topological order no consumer is decided before its producer: no need for the consumer
    # masks
    rec = RecGraph(graph, with_consumers=weight_order, search_batch_matmul=search_batch_matmul)
    cuts = _Search(rec, levels, weight_order).run()
    return Propagation(rec, cuts, levels).run()


def to_mesh(op: Operator, levels: Levels, mesh: Mesh, owners: tuple[int, ...]) -> Strategy:
    """One dim per mesh axis: the choice of most of the axis's levels (None counts; ties go to the
    earliest level), then ``FixInvalidStra``: an axis whose dim does not divide is replicated."""
    strategy: list[str | None] = []
    for ax in range(len(mesh.axes)):
        mine = [d for d, owner in zip(levels, owners) if owner == ax]
        strategy.append(max(mine, key=lambda d: (mine.count(d), -mine.index(d))) if mine else None)
    factor: dict[str, int] = {}
    for ax, dim in enumerate(strategy):
        if dim is not None:
            factor[dim] = factor.get(dim, 1) * mesh.axes[ax].size
            if op.sizes[dim] % factor[dim]:
                factor[dim] //= mesh.axes[ax].size
                strategy[ax] = None
    return tuple(strategy)


def sapp(problem: Problem, order: str = "auto") -> tuple[Strategy, ...]:
    """SMSG's D-Rec as MindSpore's SAPP (see the module text), as one strategy per operator."""
    owners = level_axes(problem.mesh)
    levels = sapp_levels(problem.graph, problem.mesh.num_devices, order)
    by_name = {op.name: lv for op, lv in zip(problem.graph.operators, levels)}
    out = []
    for i, table in enumerate(problem.ops):
        out.append(
            drop_until_valid(
                problem, i, to_mesh(table.op, by_name[table.op.name], problem.mesh, owners)
            )
        )
    return tuple(out)
