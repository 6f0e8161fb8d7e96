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
    error = 4.0 * max(1, terms) * 2.0**-52 * (abs(priced_total) + abs(price_times_limit))
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


# table entries priced at once: prices per pass = this / the largest table
PRICED_ELEMENTS = 1 << 22
MAX_PRICES_PER_PASS = 16
PRECISION = 1e-9  # the bracket around the feasibility switch is split down to this relative width


def finite_tables(chain: Sequence[Node]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per distinct table (by id; the repeated layers share theirs): its costs with every
    non-finite entry inf and its memories with every non-finite entry 0, so that cost + lam *
    memory is inf exactly where the point is unusable."""
    out = {}
    for table in chain:
        if id(table) not in out:
            out[id(table)] = (
                np.where(np.isfinite(table.cost), table.cost, np.inf),
                np.where(np.isfinite(table.mem), table.mem, 0.0),
            )
    return out


def priced_paths(
    chain: Sequence[Node], lams: np.ndarray, finite: dict | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each price in ``lams``: the least priced total (cost + lam * memory) through the chain,
    and the cost and memory of the path reaching it (first minimum, as a scalar pass would).
    ``finite``: the chain's ``finite_tables``, when the caller prices it more than once."""
    lams = np.asarray(lams, dtype=np.float64)
    finite = finite if finite is not None else finite_tables(chain)
    priced = {}
    for key, (cost, mem) in finite.items():
        # [K, a, b, points]: the same sums, element by element, as one price at a time
        value = lams[:, None, None, None] * mem[None]
        value += cost[None]  # one temporary: IEEE addition commutes, the same bits
        point = value.argmin(axis=-1)
        priced[key] = (np.take_along_axis(value, point[..., None], axis=-1)[..., 0], point)
    rows = np.arange(len(lams))
    vector, args = np.zeros((len(lams), 1)), []
    for table in chain:
        total = vector[:, :, None] + priced[id(table)][0]
        args.append(total.argmin(axis=1))
        vector = total.min(axis=1)
    state = np.zeros(len(lams), dtype=np.int64)
    cost, mem = np.zeros(len(lams)), np.zeros(len(lams))
    for table, arg in zip(reversed(chain), reversed(args)):
        prev = arg[rows, state]
        point = priced[id(table)][1][rows, prev, state]
        cost += table.cost[prev, state, point]
        mem += table.mem[prev, state, point]
        state = prev
    return vector[:, 0], cost, mem


def search_price(
    fits: Callable[[np.ndarray], np.ndarray],
    scale: float,
    per_pass: int,
    sweep_steps: int,
    stop: Callable[[float, float | None, int], bool],
) -> None:
    """The one price search of both Lagrangian paths (over the Pareto tables here, over the
    decomposition in ``planner.search.lagrangian``): ``fits(lams)`` prices each of ``lams``
    (ascending) and says which give a plan within the memory limit. A geometric sweep
    scale * 4^k (k < ``sweep_steps``, ``per_pass`` prices at a time) up to the first price that
    fits, then passes that split the bracket (the last price over the limit, the first within it)
    into per_pass + 1 parts, while ``stop(low, high, passes)`` is false (high None: no bracket
    yet). Every price priced gives the caller a bound; the search only chooses them."""
    low, high, passes = 0.0, None, 0
    for first in range(0, sweep_steps, per_pass):
        if stop(low, high, passes):
            return
        lams = scale * 4.0 ** np.arange(first, min(sweep_steps, first + per_pass))
        found = fits(lams)
        if found.any():
            k = int(np.argmax(found))
            low, high = (lams[k - 1] if k else low), lams[k]
            break
        low = lams[-1]
    while high is not None and not stop(low, high, passes):
        lams = low + (high - low) * np.arange(1, per_pass + 1) / (per_pass + 1)
        found = fits(lams)
        k = int(np.argmax(found)) if found.any() else len(lams)
        low, high = (lams[k - 1] if k else low), (lams[k] if k < len(lams) else high)
        passes += 1


def lagrangian(
    chain: Sequence[Node], limit: float, check: Callable[[], None]
) -> tuple[float, float, float]:
    """(lam of the best bound, cost of the best fitting plan found (UB), the best Lagrangian bound).

    Prices are evaluated several at a time (as many as ``PRICED_ELEMENTS`` allows for the largest
    table): a geometric sweep (x4 steps) up to the first price whose path fits, then passes that
    split the bracket between the last price that does not fit and the first that does, down to
    ``PRECISION``. Every evaluated price gives a valid bound; the best is kept."""
    best = {"cost": math.inf, "bound": -math.inf, "lam": 0.0}
    finite = finite_tables(chain)

    def at(lams: np.ndarray) -> np.ndarray:
        value, cost, mem = priced_paths(chain, lams, finite)
        for lam, v, c, m in zip(lams.tolist(), value.tolist(), cost.tolist(), mem.tolist()):
            bound = priced_bound(v, lam * limit, len(chain))
            if bound > best["bound"]:
                best["bound"], best["lam"] = bound, lam
            if m <= limit:
                best["cost"] = min(best["cost"], c)
        return mem <= limit

    if not at(np.zeros(1))[0]:
        scale = _price_scale(chain)
        largest = max(t.cost.size for t in chain)
        per_pass = int(min(MAX_PRICES_PER_PASS, max(2, PRICED_ELEMENTS // max(1, largest))))

        first_width: list[float] = []

        def stop(low: float, high: float | None, _: int) -> bool:
            if high is not None:
                # a relative width; or, when every positive price fits (low 0), 1e-12 of the first
                first_width[:] = first_width or [1e-12 * (high - low)]
                if high - low <= max(PRECISION * high, first_width[0]):
                    return True
            check()  # raises past the deadline
            return False

        search_price(at, scale, per_pass, 60, stop)
    return best["lam"], best["cost"], best["bound"]


def _price_scale(chain: Sequence[Node]) -> float:
    """The sweep's first price: the chain's largest costs over its largest memories (each
    distinct table's maxima once: the repeated layers share their tables)."""
    largest: dict[int, tuple[float, float]] = {}
    for t in chain:
        if id(t) not in largest:
            largest[id(t)] = (
                float(np.max(t.cost, initial=0.0, where=np.isfinite(t.cost))),
                float(np.max(t.mem, initial=0.0, where=np.isfinite(t.mem))),
            )
    cost = sum(largest[id(t)][0] for t in chain)
    memory = sum(largest[id(t)][1] for t in chain)
    return max(1.0, cost) / max(1.0, memory)


def kept_lagrangian(
    chain: Sequence[Node], limit: float, check: Callable[[], None], known: dict | None
) -> tuple[float, float, float]:
    """``lagrangian`` of the chain, kept in ``known`` (the tied conditions' order and the search
    after it price the same chain once)."""
    key = ("lagrangian", limit, tuple(id(t) for t in chain))
    if known is not None and key in known:
        return known[key][1]
    priced = lagrangian(chain, limit, check)
    if known is not None:
        known[key] = (chain, priced)  # the chain is held so that its tables' ids stay theirs
    return priced
