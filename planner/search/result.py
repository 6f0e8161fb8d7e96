"""The result of one solve of the integer program, shared by the solver and its fallbacks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SolveResult:
    """What one solve of the integer program (or a fallback in its place) found: the status, the
    objective and proven bound (problem units; None when no plan was found), the choice per
    operator, the time taken and the program's size."""

    status: str
    objective: int | None
    bound: int | None
    choice: tuple[int, ...] | None
    search_time_s: float
    num_booleans: int
    explanation: str = ""
    # under recompute 'auto': the mode chosen per layer
    layer_recompute: tuple[tuple[int, str], ...] = ()
    # under zero 'auto': the ZeRO stage chosen per layer
    layer_zero: tuple[tuple[int, int], ...] = ()

    @classmethod
    def no_plan(
        cls, status: str, why: str, search_time_s: float, num_booleans: int = 0
    ) -> SolveResult:
        """A search that found no plan: its status (INFEASIBLE, UNKNOWN) and why."""
        return cls(status, None, None, None, search_time_s, num_booleans, why)
