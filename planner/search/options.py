"""The options of a search run, apart from the problem: one frozen dataclass whose fields are the
one source of their defaults and help, for the Python functions and the command line alike."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from planner.search.reduce import Progress


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """How long and how a search runs (none of it changes the problem or its optimum's cost)."""

    time_limit_s: float = field(
        default=60.0, metadata={"flag": "--time-limit", "help": "solver time limit in seconds"}
    )
    seed: int = field(default=0, metadata={"flag": "--seed", "help": "solver seed, 0..2^31-1"})
    jobs: int = field(
        default=1,
        metadata={
            "flag": "--jobs",
            "help": "worker processes for distinct segments, at most the CPU count",
        },
    )
    progress: Progress | None = field(default=None, metadata={})


SEARCH_DEFAULTS = SearchOptions()


def flag_fields() -> tuple:
    """The fields the command line offers as options (``progress`` is the CLI's own display)."""
    return tuple(f for f in fields(SearchOptions) if "flag" in f.metadata)
