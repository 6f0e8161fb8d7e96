"""Brute force over every combination of strategies: the reference the exact methods are tested against."""

from __future__ import annotations

import numpy as np

from planner.cost.problem import Problem


def brute_force(problem: Problem, memory_limit: float | None = None,
                max_combinations: int = 20_000_000) -> tuple[int, tuple[int, ...]] | None:
    """Exhaustive minimum over every combination of strategies (dense numpy; small problems only).

    Returns ``(objective, choice)`` with the lexicographically first optimal choice, or None if no
    combination fits the memory limit.
    """
    counts = [len(t.strategies) for t in problem.ops]
    total_count = int(np.prod(counts, dtype=np.float64))
    if total_count > max_combinations:
        raise ValueError(f"brute force: {total_count} combinations exceed {max_combinations}")
    n = len(counts)

    def along(values: np.ndarray, axis: int) -> np.ndarray:
        shape = [1] * n
        shape[axis] = counts[axis]
        return values.reshape(shape)

    total = np.zeros(counts, dtype=np.int64)
    memory = np.zeros(counts, dtype=np.int64)
    for i, table in enumerate(problem.ops):
        total = total + along(table.cost, i)
        memory = memory + along(table.memory, i)
    for e in problem.all_edges:
        pair = e.cost[np.ix_(e.src_index, e.dst_index)]  # [producer strategy, consumer strategy]
        shape = [1] * n
        if e.src == e.dst:
            pair = np.diagonal(pair).copy()
            shape[e.src] = counts[e.src]
        else:
            shape[e.src], shape[e.dst] = counts[e.src], counts[e.dst]
            if e.src > e.dst:
                pair = pair.T
        total = total + pair.reshape(shape)
    if memory_limit is not None:
        total = np.where(memory <= memory_limit, total, np.iinfo(np.int64).max)
    flat = int(np.argmin(total))
    value = int(total.flat[flat])
    if value == np.iinfo(np.int64).max:
        return None
    return value, tuple(int(i) for i in np.unravel_index(flat, counts))
