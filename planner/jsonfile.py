"""Reading JSON input files (plans, graphs, device profiles) strictly, with one-line errors.

``json.loads`` accepts what a planner input must not hold and fails on some inputs with errors that
are not ``ValueError``: duplicate keys (the last one silently wins), ``NaN`` and ``Infinity``,
integers of thousands of digits (Python refuses to convert them), nesting deep enough to exhaust
the recursion limit (``RecursionError``), invalid UTF-8 and lone surrogates (which only fail later,
when the name is printed or written). Each is refused here, naming the file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from planner.errors import PlannerError

MAX_DEPTH = 64  # no planner file nests deeper; far below the recursion limit
# the largest JSON input read (a plan of 50,000 operators is about 8 MiB: 157 bytes each); past
# it a file is not one (/dev/zero would be read until memory ran out)
MAX_JSON_BYTES = 256 << 20


def read_json(path: Path | str, what: str, error: type[PlannerError] = PlannerError) -> object:
    """The JSON value in ``path``, or ``error`` naming ``what`` (the option, e.g. ``--plan``)."""
    return loads(read_text(path, what, error, MAX_JSON_BYTES), f"{what}: {path}", error)


def read_text(
    path: Path | str,
    what: str,
    error: type[PlannerError] = PlannerError,
    max_bytes: int | None = None,
) -> str:
    """The UTF-8 text of an input file (``-``: standard input), at most ``max_bytes`` long (None:
    any; a larger file, ``/dev/zero`` say, is refused without reading past the limit), or
    ``error`` naming ``what``."""
    limit = -1 if max_bytes is None else max_bytes + 1
    try:
        if str(path) == "-":
            raw = sys.stdin.buffer.read(limit)
        else:
            with open(path, "rb") as handle:
                raw = handle.read(limit)
    except OSError as exc:
        raise error(f"{what}: cannot read {path} ({exc.strerror or exc})") from None
    if max_bytes is not None and len(raw) > max_bytes:
        size = f"{max_bytes / 2**20:g} MiB"
        raise error(f"{what}: {path} is larger than {size}: not an input of this kind")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{what}: {path} is not UTF-8 text (byte {exc.start}; a binary file?)"
        ) from None


def loads(text: str, where: str, error: type[PlannerError] = PlannerError) -> object:
    """``json.loads`` with the checks of the module text; ``where`` starts every message."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    except RecursionError:
        raise error(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:  # e.g. an integer past the digit limit of int()
        raise error(f"{where}: not valid JSON ({str(exc).splitlines()[0][:80]})") from None
    _check_tree(value, where, error)
    return value


class _Refused(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise _Refused(f"key {key[:40]!r} appears twice in one object")
        seen[key] = value
    return seen


def _no_constant(name: str) -> object:
    raise _Refused(f"non-finite number {name} (NaN and Infinity are not JSON)")


def _check_tree(value: object, where: str, error: type[PlannerError]) -> None:
    """Depth and text checks, without recursion: every string must encode as UTF-8."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise error(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((k, depth + 1) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise error(
                    f"{where}: a string holds a lone surrogate ({item[:20]!r}); names must be "
                    "valid Unicode"
                ) from None
