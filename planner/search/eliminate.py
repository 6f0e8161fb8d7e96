"""Exact segment tables by series-parallel reduction (min-sum variable elimination) in numpy.

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
"""

from __future__ import annotations

import time

from dataclasses import dataclass

import numpy as np

CHUNK_ELEMENTS = 1 << 22


def minplus(a: np.ndarray, b: np.ndarray, middle: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``C[i,j] = min_k a[i,k] + middle[k] + b[k,j]`` and its argmin (first minimum), chunked over i."""
    n, k = a.shape
    m = b.shape[1]
    if middle is not None:
        a = a + middle[None, :]
    out = np.empty((n, m), dtype=np.float64)
    arg = np.empty((n, m), dtype=np.int64)
    step = max(1, CHUNK_ELEMENTS // max(1, k * m))
    for start in range(0, n, step):
        block = a[start:start + step, :, None] + b[None, :, :]
        arg[start:start + step] = block.argmin(axis=1)
        out[start:start + step] = np.take_along_axis(block, arg[start:start + step, None, :], axis=1)[:, 0, :]
    return out, arg


@dataclass(frozen=True, slots=True)
class Step:
    """One elimination: variable ``var`` given its neighbours ``keep`` (0, 1 or 2 of them)."""

    var: int
    keep: tuple[int, ...]
    argmin: np.ndarray


@dataclass(frozen=True, slots=True, eq=False)
class Reduction:
    """The boundary table of a network and the steps to recover every variable's state."""

    table: np.ndarray  # [entry states, exit states]
    steps: tuple[Step, ...]
    entry: int | None
    exit: int | None

    def recover(self, entry_state: int, exit_state: int, num_vars: int) -> list[int]:
        state = [-1] * num_vars
        if self.entry is not None:
            state[self.entry] = entry_state
        if self.exit is not None:
            state[self.exit] = exit_state
        for step in reversed(self.steps):
            index = tuple(state[k] for k in step.keep)
            state[step.var] = int(step.argmin[index]) if index else int(step.argmin)
        return state


@dataclass(frozen=True, slots=True, eq=False)
class Conditioned:
    """A reduction that branched on the state of ``var`` (cutset conditioning)."""

    table: np.ndarray
    var: int
    choice: np.ndarray  # [entry, exit] -> state of var
    branches: tuple
    steps: tuple[Step, ...]  # eliminations done before branching
    entry: int | None
    exit: int | None

    def recover(self, entry_state: int, exit_state: int, num_vars: int) -> list[int]:
        chosen = int(self.choice[entry_state if self.entry is not None else 0, exit_state if self.exit is not None else 0])
        state = self.branches[chosen].recover(entry_state, exit_state, num_vars)
        state[self.var] = chosen
        for step in reversed(self.steps):
            index = tuple(state[k] for k in step.keep)
            state[step.var] = int(step.argmin[index]) if index else int(step.argmin)
        return state


class Network:
    """A pairwise min-sum network over integer-indexed variables."""

    def __init__(self, unary: list[np.ndarray]) -> None:
        self.unary = [np.asarray(u, dtype=np.float64).copy() for u in unary]
        self.factors: dict[tuple[int, int], np.ndarray] = {}
        self.neighbours: list[set[int]] = [set() for _ in unary]
        self.eliminated: set[int] = set()
        self.const = 0.0

    def add_factor(self, x: int, y: int, matrix: np.ndarray) -> None:
        """Add ``matrix[state_x, state_y]`` (parallel factors on one pair are summed)."""
        if x > y:
            x, y, matrix = y, x, matrix.T
        matrix = np.asarray(matrix, dtype=np.float64)
        key = (x, y)
        self.factors[key] = self.factors[key] + matrix if key in self.factors else matrix.copy()
        self.neighbours[x].add(y)
        self.neighbours[y].add(x)

    def _take(self, x: int, v: int) -> np.ndarray:
        """Remove the factor between x and v, oriented [x, v]."""
        self.neighbours[x].discard(v)
        self.neighbours[v].discard(x)
        return self.factors.pop((x, v)) if x < v else self.factors.pop((v, x)).T

    def reduce(self, entry: int | None, exit: int | None, fixed: frozenset[int] = frozenset(),
               deadline: float | None = None) -> "Reduction | Conditioned":
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
                return self._condition(max(alive, key=lambda k: (len(self.neighbours[k]), -k)), entry, exit, steps, fixed,
                                       deadline)
            steps.append(self._eliminate(var, around))
            alive.discard(var)
            self.eliminated.add(var)
        return Reduction(self._boundary_table(entry, exit), tuple(steps), entry, exit)

    def _clone(self) -> "Network":
        other = Network.__new__(Network)
        other.unary = [u.copy() for u in self.unary]
        other.factors = {k: v.copy() for k, v in self.factors.items()}
        other.neighbours = [set(n) for n in self.neighbours]
        other.eliminated = set(self.eliminated)
        other.const = self.const
        return other

    def _condition(self, var: int, entry: int | None, exit: int | None, steps: list[Step],
                   fixed: frozenset[int], deadline: float | None) -> "Conditioned":
        branches = []
        for state in range(len(self.unary[var])):
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError("conditioning on the segment's non-series-parallel kernels ran past its share "
                                   "of the time limit")
            branch = self._clone()
            branch.const += float(branch.unary[var][state])
            for other in sorted(branch.neighbours[var]):
                branch.unary[other] += branch._take(other, var)[:, state]
            branches.append(branch.reduce(entry, exit, fixed | {var}, deadline))
        tables = np.stack([b.table for b in branches])
        choice = tables.argmin(axis=0)
        table = np.take_along_axis(tables, choice[None], axis=0)[0]
        return Conditioned(table, var, choice, tuple(branches), tuple(steps), entry, exit)

    def _eliminate(self, var: int, around: tuple[int, ...]) -> Step:
        u = self.unary[var]
        if not around:
            best = int(np.argmin(u))
            self.const += float(u[best])
            return Step(var, (), np.array(best))
        if len(around) == 1:
            (x,) = around
            m = self._take(x, var) + u[None, :]
            arg = m.argmin(axis=1)
            self.unary[x] += np.take_along_axis(m, arg[:, None], axis=1)[:, 0]
            return Step(var, (x,), arg)
        x, y = around
        value, arg = minplus(self._take(x, var), self._take(var, y), u)
        self.add_factor(x, y, value)
        return Step(var, (x, y), arg)

    def _boundary_table(self, entry: int | None, exit: int | None) -> np.ndarray:
        rows = self.unary[entry] if entry is not None else np.zeros(1)
        cols = self.unary[exit] if exit is not None else np.zeros(1)
        table = rows[:, None] + cols[None, :] + self.const
        if entry is not None and exit is not None and (min(entry, exit), max(entry, exit)) in self.factors:
            table = table + self._take(entry, exit)
        return table
