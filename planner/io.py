"""All file output of the planner (atomic: temporary file, then rename) and the graph JSON format.

Graph JSON schema (``planner plan --model graph.json``)::

    {"name": str,
     "tensors": [{"name": str, "shape": [int, ...], "role": "activation"|"param"|"data",
                  "integer": bool (optional), "checkpoint": bool (optional)}],
     "operators": [{"name": str, "kind": str (a registry kind), "equation": "bsh,hf->bsf",
                    "inputs": [tensor names], "outputs": [tensor names], "sizes": {dim: int},
                    "norm": "dims" (optional), "unsplittable": "dims" (optional),
                    "saved": [bool per input] (optional), "layer": int|null (optional),
                    "attrs": {str: int} (optional: pool kernel/stride/padding, conv stride/padding)}]}
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from planner.errors import GraphError, OutputError
from planner.graph import Graph, Operator, Tensor
from planner.ops import make_operator


def _atomic_write(path: Path | str, data: str | bytes, field: str = "output") -> None:
    """Write a file the way a user expects. A regular file (new or existing) is replaced atomically
    (temporary file, then rename) and gets the umask's mode, or keeps its own; a symlink is written
    through to its target; a FIFO or a device (``/dev/null``, ``/dev/stdout``) is written in place.
    Every OS error becomes one ``OutputError`` line naming the path."""
    raw = data.encode() if isinstance(data, str) else data
    where = f"{field} {str(path)!r}" if str(path) else field
    if not str(path):
        raise OutputError(f"{field}: empty path")
    try:
        mode = os.stat(path).st_mode if os.path.exists(path) else None  # follows symlinks
        if mode is not None and stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        if mode is not None and not stat.S_ISREG(mode):
            with open(path, "wb") as handle:  # FIFO, device, /dev/stdout: written in place, never replaced
                handle.write(raw)
            return
        _replace(Path(os.path.realpath(path)), raw)  # a symlink is written through to its target
    except OSError as exc:
        raise OutputError(f"{where}: cannot write ({exc.strerror or exc})") from None


def _replace(target: Path, raw: bytes) -> None:
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o666 & ~_umask()
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
    _atomic_write(path, text, field)


def write_json(path: Path | str, data: Any, field: str = "--json") -> None:
    _atomic_write(path, json.dumps(data, indent=2, sort_keys=False) + "\n", field)


def write_csv(path: Path | str, rows: Iterable[Mapping[str, Any]], field: str = "--csv") -> None:
    import pandas as pd
    _atomic_write(path, pd.DataFrame(list(rows)).to_csv(index=False), field)


def write_png(path: Path | str, figure: Any) -> None:
    """Save a matplotlib figure (PNG) through the same writer as every other output."""
    import io as _io
    buffer = _io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    _atomic_write(path, buffer.getvalue(), "--png")


class ResultsTable:
    """A results CSV written row by row, atomically, so an interrupted experiment can resume.

    Every ``add`` rewrites the whole file through a temporary file and a rename: the CSV on disk is
    always absent or complete. With ``resume=True`` the rows already in the file are kept and
    ``done(key)`` tells which configurations to skip; ``key_columns`` name the configuration.
    """

    def __init__(self, path: Path | str, key_columns: Iterable[str], resume: bool = False) -> None:
        self.path = Path(path)
        self.key_columns = tuple(key_columns)
        self.rows: list[dict] = []
        if resume and self.path.exists():
            import pandas as pd
            frame = pd.read_csv(self.path, keep_default_na=False, na_values=[""])
            self.rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                         for r in frame.to_dict("records")]
        self._done = {self._key(r) for r in self.rows}

    def _key(self, row: Mapping[str, Any]) -> tuple:
        return tuple(str(row.get(k)) for k in self.key_columns)

    def done(self, **config: Any) -> bool:
        """True when a row with this configuration (the key columns) is already written."""
        return self._key(config) in self._done

    def add(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append rows (one configuration's worth) and rewrite the file atomically."""
        for row in rows:
            self.rows.append(dict(row))
            self._done.add(self._key(row))
        write_csv(self.path, self.rows)


def equation_of(op: Operator) -> str:
    def operand(groups: tuple[tuple[str, ...], ...]) -> str:
        return "".join(g[0] if len(g) == 1 else "(" + "".join(g) + ")" for g in groups)
    return ",".join(operand(o.dims) for o in op.inputs) + "->" + ",".join(operand(o.dims) for o in op.outputs)


def graph_to_dict(graph: Graph) -> dict:
    return {
        "name": graph.name,
        "tensors": [{"name": t.name, "shape": list(t.shape), "role": t.role, "integer": t.integer,
                     "checkpoint": t.checkpoint} for t in graph.tensors],
        "operators": [{"name": op.name, "kind": op.kind, "equation": equation_of(op),
                       "inputs": [o.tensor for o in op.inputs], "outputs": [o.tensor for o in op.outputs],
                       "sizes": dict(op.dims), "norm": "".join(sorted(op.norm_dims)),
                       "unsplittable": "".join(sorted(op.unsplittable)), "saved": [o.saved for o in op.inputs],
                       "layer": op.layer, "attrs": dict(op.attrs)} for op in graph.operators],
    }


def save_graph(graph: Graph, path: Path | str) -> None:
    write_json(path, graph_to_dict(graph))


def _field(obj: Mapping, key: str, kind: type | tuple, where: str, default: Any = ...) -> Any:
    if key not in obj:
        if default is ...:
            raise GraphError(f"{where}: missing field '{key}'")
        return default
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,))):
        raise GraphError(f"{where}: field '{key}' has the wrong type ({type(value).__name__})")
    return value


def _int_list(values: Any, where: str, key: str) -> list[int]:
    if not isinstance(values, list):
        raise GraphError(f"{where}: field '{key}' must be a list")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise GraphError(f"{where}: field '{key}' needs integers, got {v!r}")
        if v <= 0 or v > 2**48:
            raise GraphError(f"{where}: field '{key}' needs positive sizes below 2^48, got {v!r}")
    return values


GRAPH_KEYS = {"graph": {"name", "tensors", "operators"},
              "tensor": {"name", "shape", "role", "integer", "checkpoint"},
              "operator": {"name", "kind", "equation", "inputs", "outputs", "sizes", "norm", "unsplittable", "saved",
                           "layer", "attrs"}}


def _no_unknown_keys(entry: Mapping, label: str, where: str) -> None:
    unknown = sorted(set(entry) - GRAPH_KEYS[label])
    if unknown:
        raise GraphError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(GRAPH_KEYS[label]))})")


def _entries(data: Mapping, key: str, source: str, label: str):
    """Each object of the list ``data[key]`` with a location string naming it."""
    for i, entry in enumerate(_field(data, key, list, source)):
        if not isinstance(entry, dict):
            raise GraphError(f"{source}: {label} #{i}: must be an object")
        where = f"{source}: {label} {_field(entry, 'name', str, f'{source}: {label} #{i}')}"
        _no_unknown_keys(entry, label, where)
        yield entry, where


def graph_from_dict(data: Any, source: str = "graph") -> Graph:
    """Validate and build a graph from its JSON form; errors name the file, operator and field."""
    if not isinstance(data, dict):
        raise GraphError(f"{source}: must hold a JSON object")
    _no_unknown_keys(data, "graph", source)
    tensors = []
    for t, where in _entries(data, "tensors", source, "tensor"):
        try:
            tensors.append(Tensor(t["name"], tuple(_int_list(_field(t, "shape", list, where), where, "shape")),
                                  _field(t, "role", str, where, "activation"), _field(t, "integer", bool, where, False),
                                  _field(t, "checkpoint", bool, where, False)))
        except GraphError as exc:
            message = str(exc)
            raise GraphError(message if message.startswith(source) else f"{source}: {message}") from None
    ops = []
    for o, where in _entries(data, "operators", source, "operator"):
        name = o["name"]
        sizes = _field(o, "sizes", dict, where)
        for dim, size in sizes.items():
            _int_list([size], where, f"sizes.{dim}")
        inputs = _field(o, "inputs", list, where)
        outputs = _field(o, "outputs", list, where)
        if not all(isinstance(x, str) for x in inputs + outputs):
            raise GraphError(f"{where}: fields 'inputs'/'outputs' must list tensor names")
        saved = _field(o, "saved", list, where, None)
        layer = _field(o, "layer", (int, type(None)), where, None)
        attrs = _field(o, "attrs", dict, where, {})
        try:
            ops.append(make_operator(_field(o, "kind", str, where), name, _field(o, "equation", str, where), inputs,
                                     outputs, sizes, norm=_field(o, "norm", str, where, ""),
                                     unsplittable=_field(o, "unsplittable", str, where, ""), saved=saved, layer=layer,
                                     attrs=attrs))
        except GraphError as exc:
            raise GraphError(f"{source}: {exc}") from None
    try:
        return Graph(_field(data, "name", str, source, Path(source).stem), tuple(tensors), tuple(ops))
    except GraphError as exc:
        raise GraphError(f"{source}: {exc}") from None


def load_graph(path: Path | str) -> Graph:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise GraphError(f"--model: cannot read graph file {path} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise GraphError(f"--model: graph file {path} is not UTF-8 text (a binary file?)") from None
    try:
        data = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(GraphError(f"{path}: non-finite number {c}")))
    except json.JSONDecodeError as exc:
        raise GraphError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return graph_from_dict(data, str(path))
