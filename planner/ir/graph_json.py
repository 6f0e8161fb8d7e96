"""The graph JSON format: ``graph_to_dict`` / ``save_graph`` and a validating ``load_graph``.

Graph JSON schema (``planner plan --model graph.json``)::

    {"name": str, "batch_dim": str (optional, default "b": the op dim that counts samples),
     "dim_names": "semantic"|"positional" (optional, default "semantic": the zoo's letters;
     import-torch
                  writes "positional"),
     "tensors": [{"name": str, "shape": [int, ...], "role": "activation"|"param"|"data",
                  "integer": bool (optional), "checkpoint": bool (optional)}],
     "operators": [{"name": str, "kind": str (a registry kind), "equation": "bsh,hf->bsf",
                    "inputs": [tensor names], "outputs": [tensor names], "sizes": {dim: int},
                    "norm": "dims" (optional), "unsplittable": "dims" (optional),
                    "saved": [bool per input] (optional), "layer": int|null (optional),
                    "attrs": {str: int} (optional: pool kernel/stride/padding, conv
                    stride/padding)}]}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from planner.jsonfile import read_json
from planner.errors import GraphError
from planner.ir.graph import Graph, Operator, Tensor
from planner.ir.ops import make_operator
from planner.outputs import write_json


def equation_of(op: Operator) -> str:
    def operand(groups: tuple[tuple[str, ...], ...]) -> str:
        return "".join(g[0] if len(g) == 1 else "(" + "".join(g) + ")" for g in groups)

    return (
        ",".join(operand(o.dims) for o in op.inputs)
        + "->"
        + ",".join(operand(o.dims) for o in op.outputs)
    )


def graph_to_dict(graph: Graph) -> dict:
    return {
        "name": graph.name,
        "batch_dim": graph.batch_dim,
        "dim_names": graph.dim_names,
        "tensors": [
            {
                "name": t.name,
                "shape": list(t.shape),
                "role": t.role,
                "integer": t.integer,
                "checkpoint": t.checkpoint,
            }
            for t in graph.tensors
        ],
        "operators": [
            {
                "name": op.name,
                "kind": op.kind,
                "equation": equation_of(op),
                "inputs": [o.tensor for o in op.inputs],
                "outputs": [o.tensor for o in op.outputs],
                "sizes": dict(op.dims),
                "norm": "".join(sorted(op.norm_dims)),
                "unsplittable": "".join(sorted(op.unsplittable)),
                "saved": [o.saved for o in op.inputs],
                "layer": op.layer,
                "attrs": dict(op.attrs),
            }
            for op in graph.operators
        ],
    }


def save_graph(graph: Graph, path: Path | str) -> None:
    write_json(path, graph_to_dict(graph))


def _field(obj: Mapping, key: str, kind: type | tuple, where: str, default: Any = ...) -> Any:
    if key not in obj:
        if default is ...:
            raise GraphError(f"{where}: missing field '{key}'")
        return default
    value = obj[key]
    if not isinstance(value, kind) or (
        isinstance(value, bool)
        and kind is not bool
        and bool not in (kind if isinstance(kind, tuple) else (kind,))
    ):
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


MAX_NAME = 200  # characters in an operator or tensor name (every error line quotes it)
GRAPH_KEYS = {
    "graph": {
        "name",
        "batch_dim",
        "dim_names",
        "tensors",
        "operators",
        "torch_module",
    },  # torch_module: import-torch spec
    "tensor": {"name", "shape", "role", "integer", "checkpoint"},
    "operator": {
        "name",
        "kind",
        "equation",
        "inputs",
        "outputs",
        "sizes",
        "norm",
        "unsplittable",
        "saved",
        "layer",
        "attrs",
    },
}


def _no_unknown_keys(entry: Mapping, label: str, where: str) -> None:
    unknown = sorted(set(entry) - GRAPH_KEYS[label])
    if unknown:
        raise GraphError(
            f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(GRAPH_KEYS[label]))})"
        )


def _entries(data: Mapping, key: str, source: str, label: str):
    """Each object of the list ``data[key]`` with a location string naming it."""
    for i, entry in enumerate(_field(data, key, list, source)):
        if not isinstance(entry, dict):
            raise GraphError(f"{source}: {label} #{i}: must be an object")
        name = _field(entry, "name", str, f"{source}: {label} #{i}")
        if not name or not name.isprintable() or len(name) > MAX_NAME:
            raise GraphError(
                f"{source}: {label} #{i}: field 'name' must be 1-{MAX_NAME} printable characters "
                f"(no newline or control character), got {name[:40]!r}"
            )
        where = f"{source}: {label} {name}"
        _no_unknown_keys(entry, label, where)
        yield entry, where


def _operator(o: dict, where: str, source: str) -> Operator:
    """One operator entry of a graph JSON, its fields checked."""
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
        op = make_operator(
            _field(o, "kind", str, where),
            name,
            _field(o, "equation", str, where),
            inputs,
            outputs,
            sizes,
            norm=_field(o, "norm", str, where, ""),
            unsplittable=_field(o, "unsplittable", str, where, ""),
            saved=saved,
            layer=layer,
            attrs=attrs,
        )
    except GraphError as exc:
        raise GraphError(f"{source}: {exc}") from None
    unused = sorted(set(sizes) - {d for d, _ in op.dims})
    if unused:
        raise GraphError(f"{where}: field 'sizes' names dims {unused} its equation does not use")
    return op


def graph_from_dict(data: Any, source: str = "graph") -> Graph:
    """Validate and build a graph from its JSON form; errors name the file, operator and field."""
    if not isinstance(data, dict):
        raise GraphError(f"{source}: must hold a JSON object")
    _no_unknown_keys(data, "graph", source)
    tensors = []
    for t, where in _entries(data, "tensors", source, "tensor"):
        try:
            tensors.append(
                Tensor(
                    t["name"],
                    tuple(_int_list(_field(t, "shape", list, where), where, "shape")),
                    _field(t, "role", str, where, "activation"),
                    _field(t, "integer", bool, where, False),
                    _field(t, "checkpoint", bool, where, False),
                )
            )
        except GraphError as exc:
            message = str(exc)
            raise GraphError(
                message if message.startswith(source) else f"{source}: {message}"
            ) from None
    ops = [
        _operator(o, where, source) for o, where in _entries(data, "operators", source, "operator")
    ]
    try:
        return Graph(
            _field(data, "name", str, source, Path(source).stem),
            tuple(tensors),
            tuple(ops),
            _field(data, "batch_dim", str, source, "b"),
            _field(data, "dim_names", str, source, "semantic"),
        )
    except GraphError as exc:
        raise GraphError(f"{source}: {exc}") from None


def load_graph(path: Path | str) -> Graph:
    return graph_from_dict(read_json(path, "--model", GraphError), str(path))
