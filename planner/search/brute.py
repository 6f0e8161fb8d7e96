"""Brute force over every combination of strategies: the reference the exact methods are tested
against."""

from __future__ import annotations

import math
import functools

import numpy as np

from planner.cost.problem import Problem


def _along(values: np.ndarray, ops: tuple[int, ...], dim: dict, counts: list) -> np.ndarray:
    """``values`` indexed by the strategies of ``ops`` (at most two), broadcast over the free ops
    (``dim``: each free op's axis)."""
    for k in reversed(range(len(ops))):
        if ops[k] not in dim:
            values = np.take(values, 0, axis=k)
    kept = [op for op in ops if op in dim]
    shape = [1] * len(dim)
    for op in kept:
        shape[dim[op]] = counts[op]
    if len(kept) == 2 and dim[kept[0]] > dim[kept[1]]:
        values = values.T
    return np.asarray(values).reshape(shape)


def _dense(problem: Problem, max_combinations: int):
    """Every combination's integer objective and memory as dense arrays over the operators with
    more than one strategy (``free``), and each operator's strategy count."""
    counts = [len(t.strategies) for t in problem.ops]
    total_count = int(np.prod(counts, dtype=np.float64))
    if total_count > max_combinations:
        raise ValueError(f"brute force: {total_count} combinations exceed {max_combinations}")
    # operators with one strategy are constants: numpy arrays have at most 32 dimensions, and a
    # graph on a 1-device mesh has one strategy everywhere
    free = [i for i, c in enumerate(counts) if c > 1]
    dim = {op: k for k, op in enumerate(free)}
    shape_free = [counts[i] for i in free]

    along = functools.partial(_along, dim=dim, counts=counts)
    total = np.zeros(shape_free, dtype=np.int64)
    memory = np.zeros(shape_free, dtype=np.int64)
    for i, table in enumerate(problem.ops):
        total = total + along(table.cost, (i,))
        memory = memory + along(table.memory, (i,))
    for e in problem.all_edges:
        pair = e.cost[np.ix_(e.src_index, e.dst_index)]  # [producer strategy, consumer strategy]
        if e.src == e.dst:
            total = total + along(np.diagonal(pair).copy(), (e.src,))
        else:
            total = total + along(pair, (e.src, e.dst))
    return total, memory, free, counts


def brute_force(
    problem: Problem, memory_limit: float = math.inf, max_combinations: int = 20_000_000
) -> tuple[int, tuple[int, ...]] | None:
    """Exhaustive minimum over every combination of strategies (dense numpy; small problems only).

    Returns ``(objective, choice)`` with the lexicographically first optimal choice, or None if no
    combination fits the memory limit.
    """
    total, memory, free, counts = _dense(problem, max_combinations)
    if math.isfinite(memory_limit):
        total = np.where(memory <= memory_limit, total, np.iinfo(np.int64).max)
    flat = int(np.argmin(total))
    value = int(total.flat[flat])
    if value == np.iinfo(np.int64).max:
        return None
    picked = dict(zip(free, (int(i) for i in np.unravel_index(flat, total.shape))))
    return value, tuple(picked.get(i, 0) for i in range(len(counts)))


def brute_front(
    problem: Problem, memory_limit: float = math.inf, max_combinations: int = 20_000_000
) -> list[tuple[int, int]]:
    """The exact time-memory front by enumeration: the (objective, memory) pairs no combination
    fitting ``memory_limit`` beats in both, fastest first."""
    total, memory, _, _ = _dense(problem, max_combinations)
    total, memory = total.ravel(), memory.ravel()
    fits = memory <= memory_limit
    total, memory = total[fits], memory[fits]
    order = np.lexsort((memory, total))  # by objective, then memory
    total, memory = total[order], memory[order]
    # a point is on the front when it uses less memory than every faster (or as fast) point
    before = np.concatenate(([np.iinfo(np.int64).max], np.minimum.accumulate(memory)[:-1]))
    keep = memory < before
    return list(zip(total[keep].tolist(), memory[keep].tolist()))
