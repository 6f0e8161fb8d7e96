"""Byte counts for people: GiB as the reports use them, a smaller unit where GiB would read 0.00."""

from __future__ import annotations

# the largest count a user gives (a batch, a sequence, a degree, a launch line's count): past it
# no cost is meaningful, and int64 sums of per-term costs stay exact
MAX_COUNT = 2**40


def bytes_text(value: float) -> str:
    """``80e9`` -> '74.51 GiB', ``3e6`` -> '2.86 MiB', ``512`` -> '512 B' (a limit under 5 MB is no
    '0.00 GiB')."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= 0.1 * size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"
