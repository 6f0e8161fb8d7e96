"""ATen handlers: one small function per ATen op family, registered in ``HANDLERS`` by op name
(the way DTensor registers sharding strategies per op). A handler maps one fx node to IR operators
through the ``ImportState``; an op without a handler is an error, or an opaque operator."""

from __future__ import annotations

from typing import Callable, Sequence

from planner.engines.torch.importer.builders import (
    avgpool_of,
    contraction,
    conv,
    elementwise,
    matmul,
    maxpool,
    normalize,
    permute,
    split,
    view_of,
)
from planner.engines.torch.importer.state import ImportState

Handler = Callable[[ImportState, object, str], None]
HANDLERS: dict[str, Handler] = {}

UNARY = {
    "relu": "relu",
    "gelu": "gelu",
    "dropout": "dropout",
    "tanh": "unary",
    "sigmoid": "unary",
    "silu": "silu",
    "exp": "unary",
    "neg": "unary",
    "rsqrt": "unary",
    "sqrt": "unary",
    "pow": "unary",
    "erf": "unary",
    "cos": "unary",
    "sin": "unary",
    "reciprocal": "unary",
    "hardtanh": "unary",
    "relu_": "relu",
    "log": "unary",
    "abs": "unary",
    "square": "unary",
}
BINARY = {
    "add": "add",
    "add_": "add",
    "sub": "add",
    "mul": "mul",
    "mul_": "mul",
    "div": "mul",
    "div_": "mul",
    "where": "add",
    "maximum": "add",
    "minimum": "add",
}
ALIASES = ("to", "alias", "clone", "contiguous", "detach", "lift_fresh_copy", "_to_copy", "type_as")
VIEWS = ("view", "reshape", "_unsafe_view", "flatten", "unsqueeze", "squeeze", "unflatten")


def register(*ops: str) -> Callable[[Handler], Handler]:
    """Register a handler for the ATen ops named (without the ``aten.`` prefix and overload)."""

    def wrap(handler: Handler) -> Handler:
        for op in ops:
            if op in HANDLERS:
                raise ValueError(f"torch import: ATen op {op!r} has two handlers")
            HANDLERS[op] = handler
        return handler

    return wrap


def handle(imp: ImportState, node, op: str) -> None:
    """Map one fx node calling ATen op ``op``."""
    HANDLERS.get(op, _opaque)(imp, node, op)


def input_tensors(imp: ImportState, node) -> list[str]:
    """The IR tensors an fx node reads (its inputs that are graph tensors)."""
    return [imp.tensor(a) for a in node.all_input_nodes if imp.tensor(a)]


def _opaque(imp: ImportState, node, op: str) -> None:
    imp.unknown(node, input_tensors(imp, node))


def _optional(imp: ImportState, args: Sequence, index: int) -> str | None:
    return imp.tensor(args[index]) if len(args) > index and args[index] is not None else None


# ---------------------------------------------------------------- handlers, one per op family


@register(*ALIASES)
def _alias(imp: ImportState, node, op: str) -> None:
    imp.value[node.name] = imp.tensor(node.args[0])


@register("linear")
def _linear(imp: ImportState, node, op: str) -> None:
    args = node.args
    contraction(imp, node, imp.tensor(args[0]), imp.tensor(args[1]), _optional(imp, args, 2), True)


@register("addmm")
def _addmm(imp: ImportState, node, op: str) -> None:
    args = node.args
    contraction(imp, node, imp.tensor(args[1]), imp.tensor(args[2]), imp.tensor(args[0]), False)


@register("mm", "matmul", "bmm")
def _matmuls(imp: ImportState, node, op: str) -> None:
    matmul(imp, node, imp.tensor(node.args[0]), imp.tensor(node.args[1]))


@register("conv2d", "convolution")
def _convolution(imp: ImportState, node, op: str) -> None:
    args = node.args
    # conv2d / convolution defaults
    full = list(args) + [None, None, None, 1, 0, 1, False, 0, 1][len(args) :]
    groups = full[8] if op == "convolution" else (full[6] if len(args) > 6 else 1)
    t = imp.tensor
    conv(
        imp,
        node,
        t(full[0]),
        t(full[1]),
        t(full[2]) if full[2] is not None else None,
        full[3],
        full[4],
        full[5],
        groups,
    )


@register("embedding")
def _embedding(imp: ImportState, node, op: str) -> None:
    ids, table = imp.tensor(node.args[1]), imp.tensor(node.args[0])
    lead = imp.letters(len(imp.gb.shape(ids)) + 2, imp.gb.shape(ids)[0])
    v, h = lead[-2], lead[-1]
    imp.add(
        "embedding",
        node,
        "".join(lead[:-2]) + "," + v + h + "->" + "".join(lead[:-2]) + h,
        [ids, table],
        {v: imp.gb.shape(table)[0]},
    )


@register("layer_norm")
def _layer_norm(imp: ImportState, node, op: str) -> None:
    args = node.args
    params = [imp.tensor(a) for a in args[2:4] if a is not None and imp.tensor(a)]
    normalize(imp, node, "layernorm", imp.tensor(args[0]), list(range(-len(args[1]), 0)), params)


@register("softmax", "_softmax", "log_softmax")
def _softmax(imp: ImportState, node, op: str) -> None:
    normalize(imp, node, "softmax", imp.tensor(node.args[0]), [node.args[1]], [])


@register("batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm")
def _batch_norm(imp: ImportState, node, op: str) -> None:
    args = node.args
    params = [
        imp.tensor(a) for a in args[1:3] if a is not None and imp.kind.get(imp.tensor(a)) == "param"
    ]
    normalize(imp, node, "batchnorm", imp.tensor(args[0]), [], params, channel=1)


@register("max_pool2d", "max_pool2d_with_indices")
def _max_pool(imp: ImportState, node, op: str) -> None:
    args = node.args
    maxpool(
        imp,
        node,
        imp.tensor(args[0]),
        args[1],
        args[2] if len(args) > 2 else None,
        args[3] if len(args) > 3 else 0,
    )


@register("adaptive_avg_pool2d")
def _adaptive_avg_pool(imp: ImportState, node, op: str) -> None:
    avgpool_of(imp, node, imp.tensor(node.args[0]))


@register(*VIEWS)
def _views(imp: ImportState, node, op: str) -> None:
    view_of(imp, node, imp.tensor(node.args[0]))


@register("transpose", "t")
def _transpose(imp: ImportState, node, op: str) -> None:
    args = node.args
    rank = len(imp.gb.shape(imp.tensor(args[0])))
    order = list(range(rank))
    a, b = (args[1] % rank, args[2] % rank) if op == "transpose" else (0, 1)
    order[a], order[b] = order[b], order[a]
    permute(imp, node, imp.tensor(args[0]), order)


@register("permute")
def _permute_op(imp: ImportState, node, op: str) -> None:
    permute(imp, node, imp.tensor(node.args[0]), [d % len(node.args[1]) for d in node.args[1]])


@register("expand")
def _expand(imp: ImportState, node, op: str) -> None:
    elementwise(imp, node, "add", [imp.tensor(node.args[0])])


@register("split", "split_with_sizes", "chunk")
def _splits(imp: ImportState, node, op: str) -> None:
    args = node.args
    if not split(imp, node, imp.tensor(args[0]), args[2] if len(args) > 2 else 0):
        imp.unknown(node, input_tensors(imp, node))


@register(*UNARY)
def _unary(imp: ImportState, node, op: str) -> None:
    elementwise(imp, node, UNARY[op], input_tensors(imp, node))


@register(*BINARY)
def _binary(imp: ImportState, node, op: str) -> None:
    tensors = input_tensors(imp, node)
    # with a scalar: unary
    elementwise(imp, node, BINARY[op] if len(tensors) > 1 else "unary", tensors)
