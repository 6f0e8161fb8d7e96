"""Exact segment tables by series-parallel reduction (variable elimination) over a semiring.

A segment is a pairwise cost network: one variable per operator (its strategy), unary operator
costs, and pairwise edge costs. The entry variable (layout of the incoming cut tensor) and the
exit variable (layout of the outgoing cut tensor) are kept; every other variable is eliminated:

    degree 0:  const += min_v u[v]
    degree 1:  u[x][i] += min_v F[x,v][i,k] + u[v][k]                  (chain end)
    degree 2:  F[x,y][i,j] += min_v F[x,v][i,k] + u[v][k] + F[v,y][k,j] (series: a (min,+) product)

and two factors on the same pair add elementwise (parallel branches). What remains is the
boundary table ``C[entry layout, exit layout]``: the third homomorphism theorem on trees, with no
solver call. A network with every remaining variable of degree >= 3 is not series-parallel; it is
then *conditioned* exactly on its highest-degree variable (one reduction per state of it, the
tables combined by an elementwise min), which stays exact at a cost of one factor |states| per
conditioned variable. Argmins are kept so that every operator's strategy is recovered for any
boundary pair.

One elimination order and one conditioning rule serve two algebras (a ``Semiring``): ``MinSum``
below, whose tables are (min,+) matrices, and ``planner.search.fronts.ParetoFronts``, whose tables
hold Pareto fronts of (cost, memory) points. Only the meaning of "add two tables" and "minimise
over a variable" changes between them; the network and its recovery do not.
"""

from __future__ import annotations

import time

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

CHUNK_ELEMENTS = 1 << 22


def minplus(
    a: np.ndarray, b: np.ndarray, middle: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``C[i,j] = min_k a[i,k] + middle[k] + b[k,j]`` and its argmin (first minimum), chunked over
    i."""
    n, k = a.shape
    m = b.shape[1]
    if middle is not None:
        a = a + middle[None, :]
    out = np.empty((n, m), dtype=np.float64)
    arg = np.empty((n, m), dtype=np.int64)
    step = max(1, CHUNK_ELEMENTS // max(1, k * m))
    for start in range(0, n, step):
        block = a[start : start + step, :, None] + b[None, :, :]
        arg[start : start + step] = block.argmin(axis=1)
        out[start : start + step] = np.take_along_axis(
            block, arg[start : start + step, None, :], axis=1
        )[:, 0, :]
    return out, arg


T = TypeVar("T")


class Semiring(Protocol[T]):
    """The algebra of a network's tables. ``combine`` adds two tables of one shape (parallel
    factors, or what an elimination leaves on a neighbour); each ``eliminate_*`` minimises over a
    variable and returns the table with a trace (an argmin; None where the table keeps its own)."""

    def unit(self) -> T: ...
    def combine(self, a: T, b: T) -> T: ...
    def transpose(self, a: T) -> T: ...
    def series(self, var: int, left: T, unary: T, right: T) -> tuple[T, Any]: ...
    def chain_end(self, var: int, left: T, unary: T) -> tuple[T, Any]: ...
    def collapse(self, var: int, unary: T) -> tuple[T, Any]: ...
    def pick(self, unary: T, state: int) -> T: ...
    def column(self, factor: T, state: int) -> T: ...
    def boundary(self, rows: T | None, cols: T | None, const: T) -> T: ...
    def union(self, var: int, tables: list[T]) -> tuple[T, Any]: ...
    def states(self, unary: T) -> int: ...


class MinSum:
    """(min,+) over float64 arrays: the value of the best assignment, argmins as traces."""

    def unit(self) -> np.ndarray:
        return np.zeros(())

    def combine(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def transpose(self, a: np.ndarray) -> np.ndarray:
        return a.T

    def series(self, var, left, unary, right):
        return minplus(left, right, unary)

    def chain_end(self, var, left, unary):
        m = left + unary[None, :]
        arg = m.argmin(axis=1)
        return np.take_along_axis(m, arg[:, None], axis=1)[:, 0], arg

    def collapse(self, var, unary):
        best = int(np.argmin(unary))
        return unary[best], np.array(best)

    def pick(self, unary, state):
        return unary[state]

    def column(self, factor, state):
        return factor[:, state]

    def boundary(self, rows, cols, const):
        rows = rows if rows is not None else np.zeros(1)
        cols = cols if cols is not None else np.zeros(1)
        return rows[:, None] + cols[None, :] + const

    def union(self, var, tables):
        stacked = np.stack(tables)
        choice = stacked.argmin(axis=0)
        return np.take_along_axis(stacked, choice[None], axis=0)[0], choice

    def states(self, unary) -> int:
        return len(unary)


@dataclass(frozen=True, slots=True)
class Step:
    """One elimination: variable ``var`` given its neighbours ``keep`` (0, 1 or 2 of them)."""

    var: int
    keep: tuple[int, ...]
    argmin: Any  # the semiring's trace: an argmin array under MinSum


def _replay(steps: tuple[Step, ...], state: list[int]) -> list[int]:
    for step in reversed(steps):
        index = tuple(state[k] for k in step.keep)
        state[step.var] = int(step.argmin[index]) if index else int(step.argmin)
    return state


@dataclass(frozen=True, slots=True, eq=False)
class Reduction:
    """The boundary table of a network and the steps to recover every variable's state."""

    table: Any  # [entry states, exit states]
    steps: tuple[Step, ...]
    entry: int | None
    exit: int | None

    def recover(self, entry_state: int, exit_state: int, num_vars: int) -> list[int]:
        state = [-1] * num_vars
        if self.entry is not None:
            state[self.entry] = entry_state
        if self.exit is not None:
            state[self.exit] = exit_state
        return _replay(self.steps, state)


@dataclass(frozen=True, slots=True, eq=False)
class Conditioned:
    """A reduction that branched on the state of ``var`` (cutset conditioning)."""

    table: Any
    var: int
    choice: Any  # [entry, exit] -> state of var (the semiring's union trace)
    branches: tuple
    steps: tuple[Step, ...]  # eliminations done before branching
    entry: int | None
    exit: int | None

    def recover(self, entry_state: int, exit_state: int, num_vars: int) -> list[int]:
        row = entry_state if self.entry is not None else 0
        chosen = int(self.choice[row, exit_state if self.exit is not None else 0])
        state = self.branches[chosen].recover(entry_state, exit_state, num_vars)
        state[self.var] = chosen
        return _replay(self.steps, state)


class Network(Generic[T]):
    """A pairwise network over integer-indexed variables, its tables in ``algebra``. Tables are
    never changed in place, so a clone (a conditioning branch) shares them."""

    def __init__(self, unary: list[T], algebra: Semiring[T] | None = None) -> None:
        self.algebra: Semiring[T] = algebra if algebra is not None else MinSum()
        self.unary = list(unary)
        self.factors: dict[tuple[int, int], T] = {}
        self.neighbours: list[set[int]] = [set() for _ in unary]
        self.eliminated: set[int] = set()
        self.const = self.algebra.unit()

    def add_factor(self, x: int, y: int, matrix: T) -> None:
        """Add ``matrix[state_x, state_y]`` (parallel factors on one pair are combined)."""
        if x > y:
            x, y, matrix = y, x, self.algebra.transpose(matrix)
        key = (x, y)
        known = self.factors.get(key)
        self.factors[key] = matrix if known is None else self.algebra.combine(known, matrix)
        self.neighbours[x].add(y)
        self.neighbours[y].add(x)

    def _take(self, x: int, v: int) -> T:
        """Remove the factor between x and v, oriented [x, v]."""
        self.neighbours[x].discard(v)
        self.neighbours[v].discard(x)
        if x < v:
            return self.factors.pop((x, v))
        return self.algebra.transpose(self.factors.pop((v, x)))

    def reduce(
        self,
        entry: int | None,
        exit: int | None,
        fixed: frozenset[int] = frozenset(),
        deadline: float | None = None,
    ) -> "Reduction | Conditioned":
        """Eliminate every variable but the boundary ones; min degree first, lowest index on ties.

        Conditioning nests (each branch reduces the rest of the network), so a segment with many
        kernels in sequence can grow exponentially: past ``deadline`` (perf_counter) it raises
        ``TimeoutError``."""
        keep = {k for k in (entry, exit) if k is not None} | set(fixed)
        alive = set(range(len(self.unary))) - keep - self.eliminated
        steps: list[Step] = []
        while alive:
            var = min(alive, key=lambda k: (len(self.neighbours[k]), k))
            around = tuple(sorted(self.neighbours[var]))
            if len(around) > 2:
                pivot = max(alive, key=lambda k: (len(self.neighbours[k]), -k))
                return self._condition(pivot, entry, exit, steps, fixed, deadline)
            steps.append(self._eliminate(var, around))
            alive.discard(var)
            self.eliminated.add(var)
        return Reduction(self._boundary_table(entry, exit), tuple(steps), entry, exit)

    def _clone(self) -> "Network[T]":
        other = Network(self.unary, self.algebra)
        other.factors = dict(self.factors)
        other.neighbours = [set(n) for n in self.neighbours]
        other.eliminated = set(self.eliminated)
        other.const = self.const
        return other

    def _condition(
        self,
        var: int,
        entry: int | None,
        exit: int | None,
        steps: list[Step],
        fixed: frozenset[int],
        deadline: float | None,
    ) -> Conditioned:
        algebra, branches = self.algebra, []
        for state in range(algebra.states(self.unary[var])):
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError(
                    "conditioning on the segment's non-series-parallel kernels ran past its share "
                    "of the time limit"
                )
            branch = self._clone()
            branch.const = algebra.combine(branch.const, algebra.pick(branch.unary[var], state))
            for other in sorted(branch.neighbours[var]):
                column = algebra.column(branch._take(other, var), state)
                branch.unary[other] = algebra.combine(branch.unary[other], column)
            branches.append(branch.reduce(entry, exit, fixed | {var}, deadline))
        table, choice = algebra.union(var, [b.table for b in branches])
        return Conditioned(table, var, choice, tuple(branches), tuple(steps), entry, exit)

    def _eliminate(self, var: int, around: tuple[int, ...]) -> Step:
        algebra, unary = self.algebra, self.unary[var]
        if not around:
            value, trace = algebra.collapse(var, unary)
            self.const = algebra.combine(self.const, value)
        elif len(around) == 1:
            (x,) = around
            value, trace = algebra.chain_end(var, self._take(x, var), unary)
            self.unary[x] = algebra.combine(self.unary[x], value)
        else:
            x, y = around
            value, trace = algebra.series(var, self._take(x, var), unary, self._take(var, y))
            self.add_factor(x, y, value)
        return Step(var, around, trace)

    def _boundary_table(self, entry: int | None, exit: int | None) -> T:
        rows = self.unary[entry] if entry is not None else None
        cols = self.unary[exit] if exit is not None else None
        table = self.algebra.boundary(rows, cols, self.const)
        if (
            entry is not None
            and exit is not None
            and (min(entry, exit), max(entry, exit)) in self.factors
        ):
            table = self.algebra.combine(table, self._take(entry, exit))
        return table
