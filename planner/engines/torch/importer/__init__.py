"""Import a PyTorch ``nn.Module`` through ``torch.export`` into the IR (optional extra ``torch``).

Each ATen call of the exported program becomes one IR operator in einsum form, with letters assigned
per operator from the traced shapes: linear/addmm/matmul/bmm are contractions, convolution is conv2d
(stride and padding as attrs), embedding, layer_norm, softmax, batch_norm, pooling, elementwise ops
(broadcasting dims of size 1 get their own size-1 letter), and views
(view/reshape/flatten/unsqueeze/squeeze as groups of merged dims, transpose/permute, expand, split
into equal pieces). Names: parameters keep their module path
(``transformer.h.0.attn.c_attn.weight``), operators and activations the exported node name.

Conventions: a computation that reads no parameter and no activation (position ids, attention masks
built from the input ids) is folded into a ``data`` tensor: the planner does not shard it. Aliases
(``to``, ``alias``, ``clone``, ``contiguous``, ``dropout`` with p = 0 is kept as dropout) map to
their input. Buffers (batch-norm running statistics) are data. A training loss is added: the sum of
the first floating output (``reduce``), or its cross-entropy against integer labels. Elementwise
functions are recorded by kind (relu, gelu, unary, add, mul), not by formula: an imported graph
plans and costs exactly, but the interpreter runs its elementwise ops with the kind's default
function. An ATen op outside this list is an error naming it, or with ``allow_unknown`` an
``opaque`` operator whose dims are all unsplittable (always replicated).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re

import operator as pyop

from planner.engines.torch.importer.handlers import handle
from planner.engines.torch.importer import moe, sequence
from planner.engines.torch.importer.state import ImportState, TorchImportError, failure
from planner.ir.graph import Graph

__all__ = ["TorchImportError", "import_module", "import_program"]
HANDLER_MODULES = (moe, sequence)  # imported for their @register handlers (beside handlers.py)


def _op_name(target) -> str:
    text = str(getattr(target, "__name__", target))
    return text.split(".")[1] if text.startswith("aten.") else text.split(".")[0]


def _float(val) -> bool:
    return hasattr(val, "dtype") and val.dtype.is_floating_point


def import_module(
    module,
    example_inputs: tuple,
    *,
    name: str = "",
    allow_unknown: bool = False,
    kwargs: dict | None = None,
    loss: str = "sum",
) -> Graph:
    """Export ``module`` with ``example_inputs`` (``torch.export``) and translate it into a Graph
    whose training loss is ``loss`` (see ``import_program``)."""
    try:
        import torch
    except ImportError:
        raise TorchImportError(
            "import: PyTorch is not installed (pip install -e '.[torch]')"
        ) from None
    module = module.eval()
    try:
        with _quiet_torch():
            program = torch.export.export(module, tuple(example_inputs), kwargs=kwargs or {})
    # data-dependent control flow, a wrong input shape, an error in forward
    except Exception as exc:
        raise TorchImportError(
            f"import: torch.export cannot trace {name or type(module).__name__} ({failure(exc)}); "
            "is there data-dependent control flow, a wrong example input shape or an error in "
            "forward?"
        ) from None
    return import_program(program, name or type(module).__name__.lower(), allow_unknown, loss)


@contextlib.contextmanager
def _quiet_torch():
    """torch.export logs the tracebacks of a failed trace (fake tensors, guards) at ERROR level
    before it raises; the one line the caller makes of the exception says it instead."""
    logging.disable(logging.CRITICAL)  # torch's loggers have handlers of their own: all of them
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # and it prints the traced graph itself
            yield
    finally:
        logging.disable(logging.NOTSET)


def _layer(imp: ImportState, node) -> int | None:
    """The layer of a traced op: its outermost enclosing module that is an item of a container
    (``transformer.h.3``, ``model.layers.0``), numbered in order of first appearance, so that two
    containers (an encoder's and a decoder's blocks) do not share numbers; None outside them."""
    for path, _ in (node.meta.get("nn_module_stack") or {}).values():
        if re.fullmatch(r"(?:.*\.)?\w+\.\d+", path or ""):
            return imp.layers.setdefault(path, len(imp.layers))
    return None


def import_program(program, name: str, allow_unknown: bool = False, loss: str = "sum") -> Graph:
    """Translate an ``ExportedProgram`` (see the module docstring for the conventions). ``loss``:
    ``sum`` of the first floating output, or ``cross_entropy`` of it (its last dim the classes)
    against an integer ``labels`` data tensor, as a language or classification model trains."""
    imp = ImportState(name, allow_unknown)
    specs = {s.arg.name: s for s in program.graph_signature.input_specs}
    nodes = list(program.graph.nodes)
    used = {a.name for n in nodes for a in n.all_input_nodes}
    for node in nodes:
        if node.op == "placeholder":
            _placeholder(imp, node, specs.get(node.name), node.name in used)
        elif node.op == "call_function":
            imp.gb.layer = _layer(imp, node)
            _call(imp, node)
    imp.gb.layer = None  # the loss and what follows the blocks belong to no layer
    outputs = [a for a in nodes if a.op == "output"][0].args[0]
    first = next(
        (
            o
            for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])
            if hasattr(o, "name") and imp.kind.get(imp.value.get(o.name)) == "activation"
        ),
        None,
    )
    if first is None:
        raise TorchImportError(
            "import: the module returns no floating tensor computed from its parameters"
        )
    out = imp.value[first.name]
    shape = imp.gb.shape(out)
    # 'b' first: data parallel splits it
    letters = "".join(imp.letters(len(shape), shape[0] if shape else None))
    if loss == "cross_entropy" and len(shape) >= 2:
        labels = imp.gb.data("labels", shape[:-1], integer=True)
        imp.gb.op(
            "cross_entropy",
            "loss",
            f"{letters},{letters[:-1]}->",
            [out, labels],
            norm=letters[-1],
            out="loss",
        )
    elif loss == "sum":
        imp.gb.op("reduce", "loss", f"{letters}->", [out], out="loss")
    else:
        raise TorchImportError(
            f"import: --loss {loss!r} needs 'sum' or 'cross_entropy' (over a last class dim)"
        )
    return imp.gb.build()


def _placeholder(imp: ImportState, node, spec, used: bool) -> None:
    if not used:
        return
    val = node.meta["val"]
    kind = str(getattr(spec, "kind", "")).split(".")[-1]
    tensor_name = spec.target if kind in ("PARAMETER", "BUFFER") and spec.target else node.name
    if kind == "USER_INPUT" and not imp.batch and len(val.shape):
        imp.batch = int(val.shape[0])
    if kind == "PARAMETER":
        imp.gb.param(tensor_name, tuple(val.shape))
        imp.kind[tensor_name] = "param"
    else:
        imp.gb.data(tensor_name, tuple(val.shape) or (1,), integer=not val.dtype.is_floating_point)
        imp.kind[tensor_name] = "data"
    imp.value[node.name] = tensor_name


def _call(imp: ImportState, node) -> None:
    if node.name in imp.skip:
        return
    target = node.target
    if target is pyop.getitem:
        source, index = node.args
        key = f"{source.name}#{index}"
        if key in imp.value:
            imp.value[node.name] = imp.value[key]
        elif source.name in imp.value:  # a data-like multi-output value
            _fold_data(imp, node)
        return
    val = node.meta.get("val")
    if val is None:  # assertions and other side-effect-only nodes
        return
    inputs = [imp.value.get(a.name) for a in node.all_input_nodes]
    tensors = [t for t in inputs if isinstance(t, str)]
    if not any(imp.kind.get(t) in ("param", "activation") for t in tensors):
        _fold_data(imp, node)
        return
    handle(imp, node, _op_name(target))


def _fold_data(imp: ImportState, node) -> None:
    """A value computed from data only (masks, position ids) becomes a data tensor."""
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        for i, v in enumerate(val):
            if hasattr(v, "shape"):
                name = imp.gb.data(
                    f"{node.name}.{i}", tuple(v.shape) or (1,), integer=not _float(v)
                )
                imp.kind[name] = "data"
                imp.value[f"{node.name}#{i}"] = name
        return
    if not hasattr(val, "shape"):
        imp.value[node.name] = val
        return
    name = imp.gb.data(node.name, tuple(val.shape) or (1,), integer=not _float(val))
    imp.kind[name] = "data"
    imp.value[node.name] = name
