"""A problem restricted to some strategies of some operators: the conditions of tied parameters
(``search.ties``) and the operators a user pins (``plan(..., fixed={op: strategy})``).

    restricted(P, K)  =  P with op i's candidates S_i replaced by K_i  (i in K), every edge's
                         row / column index re-read through K_i

Every search then runs on the restricted problem unchanged: its optimum is the optimum of the
original under x[i, s] = 0 for s not in K_i.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from planner.cost.problem import Problem
from planner.cost.tables import EdgeTable, OpTable
from planner.errors import SettingsError


def restrict_op(table: OpTable, strategies: Sequence[int]) -> OpTable:
    """The table with only ``strategies`` (indices into its candidates), in that order."""
    keep = list(strategies)

    def pick(values):
        return tuple(values[s] for s in keep)

    return replace(
        table,
        strategies=pick(table.strategies),
        cost=table.cost[keep],
        memory=table.memory[keep],
        out_layouts=pick(table.out_layouts),
        in_layouts=pick(table.in_layouts),
        records=pick(table.records) if table.records else (),
    )


def reindex_edge(edge: EdgeTable, kept: Mapping[int, Sequence[int]]) -> EdgeTable:
    """The edge with its strategy -> row / column maps read through the kept strategies."""
    if edge.src not in kept and edge.dst not in kept:
        return edge
    src_index = edge.src_index[list(kept[edge.src])] if edge.src in kept else edge.src_index
    dst_index = edge.dst_index[list(kept[edge.dst])] if edge.dst in kept else edge.dst_index
    return replace(
        edge, src_index=np.ascontiguousarray(src_index), dst_index=np.ascontiguousarray(dst_index)
    )


def restricted(problem: Problem, kept: Mapping[int, Sequence[int]]) -> Problem:
    """``problem`` with op ``i`` keeping only the strategies ``kept[i]`` (edges and tie edges
    re-indexed)."""
    ops = tuple(restrict_op(t, kept[i]) if i in kept else t for i, t in enumerate(problem.ops))
    return replace(
        problem,
        ops=ops,
        edges=tuple(reindex_edge(e, kept) for e in problem.edges),
        ties=tuple(reindex_edge(e, kept) for e in problem.ties),
        _producer_index={},
    )


def pinned(problem: Problem, fixed: Mapping[str, Mapping[str, str | None]]) -> Problem:
    """``problem`` with each operator named in ``fixed`` held to its given strategy, ``{mesh axis:
    dim or None}`` (an axis left out replicates). Raises ``SettingsError`` naming ``fixed`` for an
    unknown operator or axis, or a strategy that is not one of the operator's candidates."""
    if not isinstance(fixed, Mapping) or not all(isinstance(v, Mapping) for v in fixed.values()):
        raise SettingsError(
            "fixed: a mapping {operator name: {mesh axis: dim or None}}, got "
            f"{type(fixed).__name__}"
        )
    names = {t.op.name: i for i, t in enumerate(problem.ops)}
    axes = problem.mesh.names
    kept = {}
    for name, strategy in fixed.items():
        if name not in names:
            raise SettingsError(f"fixed: the model has no operator {name!r}")
        if not isinstance(strategy, Mapping) or set(strategy) - set(axes):
            raise SettingsError(
                f"fixed: operator {name!r}: the strategy must map mesh axes of {problem.mesh.spec} "
                f"({', '.join(axes)}) to dims, got {strategy!r}"
            )
        wanted = tuple(strategy.get(axis) for axis in axes)
        table = problem.ops[names[name]]
        if wanted not in table.strategies:
            raise SettingsError(
                f"fixed: operator {name!r}: {dict(zip(axes, wanted))} is not one of its "
                f"{len(table.strategies)} candidate strategies (invalid, or dominated by another "
                "with the same layouts)"
            )
        kept[names[name]] = [table.strategies.index(wanted)]
    return restricted(problem, kept)
