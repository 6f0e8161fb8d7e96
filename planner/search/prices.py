"""Lagrangian prices over a chain of Pareto front tables (``planner.search.pareto``).

At a price lam >= 0 on memory, each table point weighs cost + lam * memory; the least priced path
through the chain, less lam * limit, is a lower bound on every plan within the memory limit:

    L(lam) = min over paths (sum cost + lam * sum memory) - lam * M  <=  OPT(M)

``lagrangian`` bisects lam (doubling, then halving) for the best bound and the cheapest path that
fits (an upper bound); ``suffix`` gives, per boundary state, the least priced cost to finish,
which prunes the master's labels.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from planner.search.fronts import Node


def priced_bound(priced_total: float, price_times_limit: float, terms: int) -> float:
    """The Lagrangian bound ``priced_total - price * limit`` less its float rounding error: the
    total sums ``terms`` float terms, and at a large price both sides dwarf the objective (a price
    of 4^80 gave a 'bound' of 9.5e44 above a plan that fits)."""
    error = 4.0 * max(1, terms) * 2.0 ** -52 * (abs(priced_total) + abs(price_times_limit))
    return priced_total - price_times_limit - error


def scalar(table: Node, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Per (entry, exit): least cost + lam * memory over the front, and the point reaching it."""
    value = table.cost + (lam * table.mem if lam else 0.0)
    value = np.where(np.isfinite(table.cost), value, np.inf)
    point = value.argmin(axis=-1)
    return np.take_along_axis(value, point[..., None], axis=-1)[..., 0], point


def suffix(chain: Sequence[Node], lam: float | None) -> list[np.ndarray]:
    """Per boundary k and state: least cost (+ lam * memory; lam None: least memory) to finish."""
    out, seen = [np.zeros(chain[-1].shape[1])], {}
    for table in reversed(chain):
        if id(table) not in seen:  # the repeated layers share their tables
            seen[id(table)] = table.mem.min(axis=-1) if lam is None else scalar(table, lam)[0]
        weights = seen[id(table)]
        out.append((weights + out[-1][None, :]).min(axis=1))
    return out[::-1]


def lagrangian(chain: Sequence[Node], limit: float, check: Callable[[], None]) -> tuple[float, float, float]:
    """(lam of the best bound, cost of the best fitting plan found (UB), the best Lagrangian bound)."""
    best_cost, best_bound, best_lam = math.inf, -math.inf, 0.0

    def at(lam: float) -> bool:
        nonlocal best_cost, best_bound, best_lam
        distinct = {id(t): t for t in chain}  # the repeated layers share their tables
        priced = {key: scalar(t, lam) for key, t in distinct.items()}
        weights = [priced[id(t)] for t in chain]
        vector, args = np.zeros(1), []
        for value, _ in weights:
            total = vector[:, None] + value
            args.append(total.argmin(axis=0))
            vector = total.min(axis=0)
        state, cost, mem = 0, 0.0, 0.0
        for (value, point), table, arg in zip(reversed(weights), reversed(chain), reversed(args)):
            prev = int(arg[state])
            cost += table.cost[prev, state, point[prev, state]]
            mem += table.mem[prev, state, point[prev, state]]
            state = prev
        value = priced_bound(float(vector[0]), lam * limit, len(chain))
        if value > best_bound:
            best_bound, best_lam = value, lam
        if mem <= limit:
            best_cost = min(best_cost, cost)
            return True
        return False

    scale = max(1.0, sum(float(np.nanmax(np.where(np.isfinite(t.cost), t.cost, 0))) for t in chain)) / \
        max(1.0, sum(float(np.nanmax(np.where(np.isfinite(t.mem), t.mem, 0))) for t in chain))
    low, high = 0.0, scale
    if not at(0.0):
        for _ in range(60):
            check()
            if at(high):
                break
            low, high = high, high * 4
        for _ in range(40):
            check()
            mid = 0.5 * (low + high)
            low, high = (low, mid) if at(mid) else (mid, high)
    return best_lam, best_cost, best_bound
