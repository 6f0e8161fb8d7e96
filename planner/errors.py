"""Exception types. Every planner error is a ``ValueError`` whose message names the offending
field."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterable, Mapping


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


# A command-line flag at a word start: ``--time-limit`` (not ``a--b``, not the ``-`` of ``-1``).
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")


def python_message(message: str, parameters: Iterable[str], aliases: Mapping[str, str]) -> str:
    """``message`` with each ``--flag`` it names replaced by the Python name of the same input.

    A flag whose snake-case spelling is one of ``parameters`` becomes that parameter; otherwise
    ``aliases`` (flag -> Python name, e.g. ``hardware`` -> ``hardware_csv``) names it; a flag
    in neither keeps its snake-case spelling, so no message raised from Python reads ``--``.
    """
    known = set(parameters)

    def name(match: re.Match) -> str:
        flag = match.group(1)
        snake = flag.replace("-", "_")
        return snake if snake in known else aliases.get(flag, snake)

    return _FLAG.sub(name, message)


def naming_parameters(func: Callable, aliases: Mapping[str, str]) -> Callable:
    """``func`` with the messages of the ``PlannerError``s it raises naming its parameters.

    The library's messages name the command-line flag (``--mesh: ...``) because the command line
    is one caller; a Python caller passed ``mesh=``, and reads ``mesh: ...``. The error keeps its
    type, attributes and traceback; only its message changes.
    """
    parameters = tuple(inspect.signature(func).parameters)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except PlannerError as error:
            if error.args and isinstance(error.args[0], str):
                renamed = python_message(error.args[0], parameters, aliases)
                error.args = (renamed, *error.args[1:])
            raise

    return wrapper
