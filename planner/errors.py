"""Exception types. Every planner error is a ``ValueError`` whose message names the offending
field."""

from __future__ import annotations


class PlannerError(ValueError):
    """Base class: bad input to the planner (exit code 2 on the command line)."""


class GraphError(PlannerError):
    """A malformed graph: cycle, shape mismatch, unknown operator, bad dim."""


class MeshError(PlannerError):
    """A mesh spec that does not parse or does not fit the device count."""


class ProfileError(PlannerError):
    """An unknown or malformed machine profile."""


class ModelError(PlannerError):
    """An unknown zoo model or a bad model parameter."""


class SettingsError(PlannerError):
    """Bad training settings (batch, dtype, optimizer, memory limit)."""


class InfeasibleError(PlannerError):
    """No plan fits the memory limit (exit code 3 on the command line)."""


class OutputError(PlannerError):
    """An output path that cannot be written (directory, full disk, no permission)."""
