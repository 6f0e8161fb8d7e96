"""The one module that writes files: every output of the planner goes through ``atomic_write``.

A regular file is replaced atomically (temporary file, then rename), so a reader never sees half a
result and an interrupted run leaves the previous file as it was.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from planner.errors import OutputError


def atomic_write(path: Path | str, data: str | bytes, field: str = "output") -> None:
    """Write a file the way a user expects. A regular file (new or existing) is replaced atomically
    (temporary file, then rename) and gets the umask's mode, or keeps its own; a symlink is written
    through to its target; a FIFO or a device (``/dev/null``, ``/dev/stdout``) is written in place.
    Every OS error becomes one ``OutputError`` line naming the path."""
    _output(path, field, data.encode() if isinstance(data, str) else data)


def check_writable(path: Path | str, field: str = "output") -> None:
    """``OutputError`` naming ``field`` when ``path`` could not be written as ``atomic_write``
    writes it: checked for every output before a command works or writes, so that one output
    refused leaves the others as they were (a temporary file is made and removed where the file
    would go, or in the nearest directory that exists: ``atomic_write`` makes the missing ones)."""
    _output(path, field, None)


def _output(path: Path | str, field: str, raw: bytes | None) -> None:
    """``raw`` written to ``path`` (None: only checked); OS errors as one ``OutputError``."""
    where = f"{field} {str(path)!r}" if str(path) else field
    if not str(path):
        raise OutputError(f"{field}: empty path")
    try:
        if os.path.islink(path) and not os.path.exists(path):
            try:
                os.stat(path)  # a link that loops raises ELOOP here
            except FileNotFoundError:
                pass  # a dangling link: written through to the target it names
        mode = os.stat(path).st_mode if os.path.exists(path) else None  # follows symlinks
        if mode is not None and stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        if mode is not None and not stat.S_ISREG(mode):
            # FIFO, device, /dev/stdout: written in place, never replaced (nor opened to check:
            # a FIFO blocks)
            _in_place(path, raw)
            return
        target = Path(os.path.realpath(path))  # a symlink is written through to its target
        if raw is None:
            _probe(target.parent)
        else:
            _replace(target, raw)
    except OSError as exc:
        raise OutputError(f"{where}: cannot write ({exc.strerror or exc})") from None


def _in_place(path: Path | str, raw: bytes | None) -> None:
    if raw is None:
        if not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, "permission denied")
        return
    with open(path, "wb") as handle:
        handle.write(raw)


def _probe(parent: Path) -> None:
    """A temporary file made and removed in ``parent``, or the nearest directory above it that
    exists (the write makes the missing ones)."""
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory")
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".planner-check.", suffix=".tmp")
    os.close(fd)
    os.unlink(tmp)


def _replace(target: Path, raw: bytes) -> None:
    # the permission bits only: a rewritten file never keeps a setuid, setgid or sticky bit
    mode = stat.S_IMODE(target.stat().st_mode) & 0o777 if target.exists() else 0o666 & ~_umask()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    current = os.umask(0)  # the only portable way to read it
    os.umask(current)
    return current


def write_text(path: Path | str, text: str, field: str = "output") -> None:
    atomic_write(path, text, field)


def write_json(path: Path | str, data: Any, field: str = "--json") -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=False) + "\n", field)


def write_csv(path: Path | str, rows: Iterable[Mapping[str, Any]], field: str = "--csv") -> None:
    import pandas as pd

    atomic_write(path, pd.DataFrame(list(rows)).to_csv(index=False), field)


def write_bytes(path: Path | str, data: bytes, field: str = "output") -> None:
    atomic_write(path, data, field)
