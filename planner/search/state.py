"""What one exact search carries from phase to phase (``planner.search.exact``): the problem and
its limits, the segments, what each phase found, and the cache the tied-layout conditions share."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.cost.problem import Problem
from planner.search.decompose import Segment
from planner.search.reduce import DecomposedSolution, Progress, Workers
from planner.search.result import SolveResult

if TYPE_CHECKING:
    from planner.search.layer_modes import LayerOptions

Outcome = tuple[SolveResult, tuple[str, ...]]  # a result and the notes that explain it


@dataclass(slots=True)
class SearchCache:
    """Shared by the conditions of one tied search: what a segment the ties leave alone costs is
    worked out once (keys hash the segment's content, so equal keys mean equal tables)."""

    reduced: dict[str, Any] = field(default_factory=dict)  # segment key -> its (min,+) reduction
    variants: dict[tuple[str, int], Problem] = field(default_factory=dict)  # layer mode -> problem
    fronts: dict = field(default_factory=dict)  # (option, cap, segment key) -> front table


@dataclass(slots=True)
class SearchState:
    """One untied problem's search. ``memory_limit`` is a float (inf: none); ``incumbent``, the
    cost of a plan another tied condition found (a plan here must beat it)."""

    problem: Problem
    memory_limit: float
    time_limit_s: float
    seed: int = 0
    jobs: int = 1
    progress: Progress | None = None
    cache: SearchCache | None = None
    incumbent: int | None = None
    start: float = field(default_factory=time.perf_counter)
    segments: tuple[Segment, ...] = ()
    notes: tuple[str, ...] = ()
    workers: Workers | None = None
    options: "LayerOptions | None" = None  # recompute / zero 'auto': built only when memory binds
    free: DecomposedSolution | None = None  # the unconstrained optimum
    fits: bool = False  # whether the unconstrained optimum fits the memory limit
    step_s: float = 0.0  # the longest price step so far
    proven: int | None = None  # a lower bound a cut Pareto master proved

    @property
    def deadline(self) -> float:
        return self.start + self.time_limit_s

    def shared(self) -> SearchCache:
        """The cache (a fresh one for an untied search: it keeps nothing across searches)."""
        if self.cache is None:
            self.cache = SearchCache()
        return self.cache

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def outcome(
        self,
        status: str,
        objective: int | None = None,
        bound: int | None = None,
        choice: tuple[int, ...] | None = None,
        explanation: str = "",
        note: str = "",
        **layers,
    ) -> Outcome:
        """The result, timed from the start, and the notes with ``note`` last (when given)."""
        result = SolveResult(
            status,
            objective,
            bound,
            choice,
            time.perf_counter() - self.start,
            0,
            explanation,
            **layers,
        )
        return result, self.notes + ((note,) if note else ())
