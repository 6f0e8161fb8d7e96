"""An interpreter for the IR: one implementation per operator kind, on numpy or jax.numpy.

Every operator runs from its einsum form: operands are reshaped to one axis per op dim, then
contracted (``einsum``), broadcast (elementwise ops) or normalised over the op's norm dims. The
same code runs on a device's local shard: ``sizes`` then gives the local dim sizes and
``offsets`` the global index of the shard's first element per dim (embedding lookups and the
MoE gate need global positions). Numeric conventions (they do not change costs):

- cross_entropy and reduce return sums (not means), so partial sums over a split batch add up;
- conv2d and pooling read ``stride`` (default H // p) and ``padding`` (default (kernel - 1) // 2)
  from the operator's attrs; maxpool also reads ``kernel`` (default: the stride);
- batchnorm normalises each channel over batch and space (training statistics);
- dropout is the identity (deterministic runs); gelu is the tanh approximation;
- moe_gate is elementwise in the experts (the cost model declares it so): a sigmoid of the router
  logit routed to capacity slot (s mod C); split/concat index their pieces by the first dim that
  only the whole side has.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from planner.errors import GraphError
from planner.ir.graph import Graph, Operand, Operator

Array = Any
BIAS = "+bias"  # key of ``offsets``: 0 on the shards of a Partial output that must not add the bias


def cast(x: Array, dtype) -> Array:
    """``x`` as ``dtype`` (numpy and jax arrays: astype; torch tensors: to)."""
    return x.astype(dtype) if hasattr(x, "astype") else x.to(dtype)


def letters(operand: Operand) -> str:
    return "".join(d for group in operand.dims for d in group)


def split_dims(x: Array, operand: Operand, sizes: Mapping[str, int], xp) -> Array:
    """Reshape an operand to one axis per op dim."""
    return xp.reshape(x, tuple(sizes[d] for d in letters(operand)))


def merge_dims(x: Array, operand: Operand, sizes: Mapping[str, int], xp) -> Array:
    """Reshape from one axis per op dim back to the operand's tensor shape."""
    return xp.reshape(x, tuple(math.prod(sizes[d] for d in g) for g in operand.dims))


def align(x: Array, src: str, dst: str, sizes: Mapping[str, int], xp) -> Array:
    """Sum away dims not in ``dst``, order the rest as in ``dst``, add size-1 axes for the
    missing."""
    kept = "".join(d for d in dst if d in src)
    if kept != src:
        x = xp.einsum(f"{src}->{kept}", x)
    return xp.reshape(x, tuple(sizes[d] if d in src else 1 for d in dst))


def _contraction(op, args, sizes, offsets, xp):
    out = op.outputs[0]
    out_letters = letters(out)
    main = [k for k, o in enumerate(op.inputs) if k < 2 or not set(letters(o)) <= set(out_letters)]
    spec = ",".join(letters(op.inputs[k]) for k in main) + "->" + out_letters
    y = xp.einsum(spec, *[split_dims(args[k], op.inputs[k], sizes, xp) for k in main])
    for k, operand in enumerate(op.inputs):
        if k not in main:  # a bias, added once (see ``bias_scale``)
            y = y + offsets.get(BIAS, 1) * align(
                split_dims(args[k], operand, sizes, xp), letters(operand), out_letters, sizes, xp
            )
    return [merge_dims(y, out, sizes, xp)]


def _conv_geometry(op: Operator, sizes: Mapping[str, int], window: tuple[int, int]):
    height, out_h = sizes["H"], sizes["p"]
    stride = op.attr("stride", max(1, height // out_h))
    return stride, op.attr("padding", (window[0] - 1) // 2)


def _windows(x, window, stride, padding, out_hw, xp, fill):
    """Yield (i, j, strided window view) over the kernel positions of a padded NCHW input."""
    x = xp.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=fill)
    for i in range(window[0]):
        for j in range(window[1]):
            yield (
                i,
                j,
                x[:, :, i : i + stride * out_hw[0] : stride, j : j + stride * out_hw[1] : stride],
            )


def _conv2d(op, args, sizes, offsets, xp):
    x, w = args[0], args[1]
    window = (w.shape[2], w.shape[3])
    stride, padding = _conv_geometry(op, sizes, window)
    out_hw = (sizes["p"], sizes["q"])
    y = 0
    for i, j, view in _windows(x, window, stride, padding, out_hw, xp, 0.0):
        y = y + xp.einsum("bcpq,oc->bopq", view, w[:, :, i, j])
    if len(args) > 2:
        y = y + offsets.get(BIAS, 1) * xp.reshape(args[2], (1, -1, 1, 1))
    return [y]


def _maxpool(op, args, sizes, offsets, xp):
    stride = op.attr("stride", max(1, sizes["H"] // sizes["p"]))
    kernel = op.attr("kernel", stride)
    padding = op.attr("padding", 0)
    y = None
    for _, _, view in _windows(
        args[0], (kernel, kernel), stride, padding, (sizes["p"], sizes["q"]), xp, -math.inf
    ):
        y = view if y is None else xp.maximum(y, view)
    return [y]


def _embedding(op, args, sizes, offsets, xp):
    ids, table = args
    vocab_dim = letters(op.inputs[1])[0]
    local = ids - offsets.get(vocab_dim, 0)
    if xp.__name__ != "numpy":
        # A one-hot contraction (as MaxText and T5X do on TPUs): its gradient is a matmul whose
        # partial sums the SPMD partitioner reduces once with the other uses of a tied table.
        # The JAX check may pass the ids already one-hot, in the plan's layout (``xla.edge_hooks``).
        one_hot = (
            ids
            if ids.ndim == len(op.inputs[0].dims) + 1
            else cast(xp.expand_dims(local, -1) == xp.arange(table.shape[0]), table.dtype)
        )
        return [xp.einsum("...v,vh->...h", cast(one_hot, table.dtype), table)]
    inside = (local >= 0) & (local < table.shape[0])
    rows = xp.take(table, xp.clip(local, 0, table.shape[0] - 1), axis=0)
    return [rows * cast(xp.expand_dims(inside, -1), rows.dtype)]


def _elementwise(fn: Callable) -> Callable:
    def run(op, args, sizes, offsets, xp):
        out = op.outputs[0]
        target = letters(out)
        aligned = [
            align(split_dims(a, o, sizes, xp), letters(o), target, sizes, xp)
            for a, o in zip(args, op.inputs)
        ]
        y = fn(xp, *aligned)
        return [merge_dims(xp.broadcast_to(y, tuple(sizes[d] for d in target)), out, sizes, xp)]

    return run


def _gelu(xp, x):
    return 0.5 * x * (1 + xp.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def _normalize(op, args, sizes, offsets, xp):
    """softmax / layernorm / rmsnorm / batchnorm over the op's norm dims (batchnorm: all but c)."""
    out = op.outputs[0]
    target = letters(out)
    x = split_dims(args[0], op.inputs[0], sizes, xp)
    norm = set(op.norm_dims) if op.kind != "batchnorm" else set(target) - {letters(op.inputs[1])[0]}
    axes = tuple(i for i, d in enumerate(target) if d in norm)
    if op.kind == "softmax":
        z = xp.exp(x - xp.max(x, axis=axes, keepdims=True))
        y = z / xp.sum(z, axis=axes, keepdims=True)
    elif op.kind == "rmsnorm":
        y = x / xp.sqrt(xp.mean(x * x, axis=axes, keepdims=True) + 1e-5)
    else:
        mean = xp.mean(x, axis=axes, keepdims=True)
        y = (x - mean) / xp.sqrt(xp.mean((x - mean) ** 2, axis=axes, keepdims=True) + 1e-5)
    scales = [
        align(split_dims(a, o, sizes, xp), letters(o), target, sizes, xp)
        for a, o in zip(args[1:], op.inputs[1:])
    ]
    if scales:
        y = y * scales[0]
    if len(scales) > 1:
        y = y + scales[1]
    return [merge_dims(y, out, sizes, xp)]


def _cross_entropy(op, args, sizes, offsets, xp):
    logits, labels = args[0], args[1]
    class_dim = letters(op.inputs[0])[-1]
    lse = xp.log(xp.sum(xp.exp(logits - xp.max(logits, axis=-1, keepdims=True)), axis=-1)) + xp.max(
        logits, axis=-1
    )
    local = labels - offsets.get(class_dim, 0)
    picked = xp.take_along_axis(
        logits, xp.expand_dims(xp.clip(local, 0, logits.shape[-1] - 1), -1), axis=-1
    )[..., 0]
    return [xp.reshape(xp.sum(lse - picked), ())]


def _reduce(op, args, sizes, offsets, xp):
    out = op.outputs[0]
    y = xp.einsum(
        f"{letters(op.inputs[0])}->{letters(out)}", split_dims(args[0], op.inputs[0], sizes, xp)
    )
    if op.kind in ("avgpool", "mean"):
        # the global count: a split reduced dim leaves partial sums, which add up to the full mean
        y = y / math.prod(op.sizes[d] for d in letters(op.inputs[0]) if d not in letters(out))
    return [merge_dims(y, out, sizes, xp)]


def _view(op, args, sizes, offsets, xp):
    out = op.outputs[0]
    y = align(
        split_dims(args[0], op.inputs[0], sizes, xp), letters(op.inputs[0]), letters(out), sizes, xp
    )
    return [merge_dims(y, out, sizes, xp)]


def _split(op, args, sizes, offsets, xp):
    """One input, k outputs: output i is piece i of the dim that only the input has."""
    whole = letters(op.inputs[0])
    piece = next(d for d in whole if d not in letters(op.outputs[0]))
    x = split_dims(args[0], op.inputs[0], sizes, xp)
    axis = whole.index(piece)
    outs = []
    for i, out in enumerate(op.outputs):
        part = xp.take(x, i, axis=axis)
        outs.append(
            merge_dims(
                align(part, whole.replace(piece, ""), letters(out), sizes, xp), out, sizes, xp
            )
        )
    return outs


def _slice(op, args, sizes, offsets, xp):
    """Piece ``attrs["index"]`` of the dim that only the input has (``b(sk)h->bkh``)."""
    whole = letters(op.inputs[0])
    piece = next(d for d in whole if d not in letters(op.outputs[0]))
    part = xp.take(
        split_dims(args[0], op.inputs[0], sizes, xp), op.attr("index", 0), axis=whole.index(piece)
    )
    out = op.outputs[0]
    return [
        merge_dims(align(part, whole.replace(piece, ""), letters(out), sizes, xp), out, sizes, xp)
    ]


def _concat(op, args, sizes, offsets, xp):
    out = op.outputs[0]
    whole = letters(out)
    own = [next((d for d in letters(o) if d not in whole), None) for o in op.inputs]
    # inputs of different lengths along one dim (``bnh,kh->bsh``): concatenate, broadcasting
    if all(own):
        joined = next(d for d in whole if all(d not in letters(o) for o in op.inputs))
        parts = []
        for arg, operand, dim in zip(args, op.inputs, own):
            target = whole.replace(joined, dim)
            x = align(split_dims(arg, operand, sizes, xp), letters(operand), target, sizes, xp)
            parts.append(xp.broadcast_to(x, tuple(sizes[d] for d in target)))
        return [merge_dims(xp.concatenate(parts, axis=whole.index(joined)), out, sizes, xp)]
    piece = next(d for d in whole if d not in letters(op.inputs[0]))
    rest = whole.replace(piece, "")
    parts = [
        align(split_dims(a, o, sizes, xp), letters(o), rest, sizes, xp)
        for a, o in zip(args, op.inputs)
    ]
    return [merge_dims(xp.stack(parts, axis=whole.index(piece)), out, sizes, xp)]


def _attention(op, args, sizes, offsets, xp):
    """softmax(q k^T * scale [+ bias] [causal]) v; q's last dim is the head dim, k's own dim the key
    position (the query position sits at the same place in q). ``attrs``: causal (0/1)."""
    lq, lk, lv, lo = (letters(o) for o in (*op.inputs[:3], op.outputs[0]))
    head, key = lq[-1], next(d for d in lk if d not in lq)
    query = lq[lk.index(key)]
    scores = lq.replace(head, "") + key
    q, k, v = (split_dims(a, o, sizes, xp) for a, o in zip(args[:3], op.inputs[:3]))
    z = xp.einsum(f"{lq},{lk}->{scores}", q, k) / math.sqrt(op.sizes[head])
    if len(args) > 3:
        z = z + align(
            split_dims(args[3], op.inputs[3], sizes, xp), letters(op.inputs[3]), scores, sizes, xp
        )
    if op.attr("causal", 0):
        q_pos = xp.arange(sizes[query]) + offsets.get(query, 0)
        k_pos = xp.arange(sizes[key]) + offsets.get(key, 0)
        allowed = xp.reshape(k_pos, (1, -1)) <= xp.reshape(q_pos, (-1, 1))
        z = xp.where(align(allowed, query + key, scores, sizes, xp), z, -1e30)
    z = xp.exp(z - xp.max(z, axis=-1, keepdims=True))
    p = z / xp.sum(z, axis=-1, keepdims=True)
    return [merge_dims(xp.einsum(f"{scores},{lv}->{lo}", p, v), op.outputs[0], sizes, xp)]


def _moe_gate(op, args, sizes, offsets, xp):
    logits = split_dims(args[0], op.inputs[0], sizes, xp)  # b, s, e
    b, s, e = letters(op.inputs[0])
    c = next(d for d in letters(op.outputs[0]) if d not in (b, s, e))
    position = xp.arange(sizes[s]) + offsets.get(s, 0)
    slot = xp.arange(sizes[c]) + offsets.get(c, 0)
    route = xp.reshape(position % op.sizes[c], (-1, 1)) == xp.reshape(slot, (1, -1))
    gate = 1.0 / (1.0 + xp.exp(-logits))
    y = xp.reshape(gate, gate.shape + (1,)) * xp.reshape(
        cast(route, gate.dtype), (1, sizes[s], 1, sizes[c])
    )
    return [merge_dims(y, op.outputs[0], sizes, xp)]


KERNELS: Mapping[str, Callable] = {
    **{
        k: _contraction
        for k in ("matmul", "linear", "batch_matmul", "einsum", "moe_dispatch", "moe_combine")
    },
    "conv2d": _conv2d,
    "maxpool": _maxpool,
    "embedding": _embedding,
    "gelu": _elementwise(lambda xp, x: _gelu(xp, x)),
    "relu": _elementwise(lambda xp, x: xp.maximum(x, 0)),
    "dropout": _elementwise(lambda xp, x: x),
    "unary": _elementwise(lambda xp, x: xp.tanh(x)),
    "silu": _elementwise(lambda xp, x: x / (1 + xp.exp(-x))),
    "attention": _attention,
    "add": _elementwise(lambda xp, *xs: sum(xs[1:], xs[0])),
    "bias_add": _elementwise(lambda xp, *xs: sum(xs[1:], xs[0])),
    "mul": _elementwise(lambda xp, x, y: x * y),
    **{k: _normalize for k in ("softmax", "layernorm", "rmsnorm", "batchnorm")},
    "cross_entropy": _cross_entropy,
    "reduce": _reduce,
    "avgpool": _reduce,
    "mean": _reduce,
    "reshape": _view,
    "transpose": _view,
    "split": _split,
    "slice": _slice,
    "concat": _concat,
    "moe_gate": _moe_gate,
}


def run_operator(
    op: Operator,
    args: list[Array],
    xp,
    sizes: Mapping[str, int] | None = None,
    offsets: Mapping[str, int] | None = None,
) -> list[Array]:
    """Run one operator (on full tensors, or on a shard with its local ``sizes`` and
    ``offsets``)."""
    kernel = KERNELS.get(op.kind)
    if kernel is None:
        raise GraphError(f"operator {op.name}: field 'kind' {op.kind!r} has no interpreter kernel")
    return kernel(op, args, dict(sizes or op.sizes), dict(offsets or {}), xp)


def run_graph(
    graph: Graph,
    feeds: Mapping[str, Array],
    xp,
    on_input: Callable | None = None,
    on_output: Callable | None = None,
) -> dict[str, Array]:
    """Run the graph forward from param and data ``feeds``; returns every tensor's value.

    ``on_input(op, slot, value)`` and ``on_output(op, slot, value)`` may replace values (the JAX
    export puts sharding constraints there)."""
    env = dict(feeds)
    missing = [t.name for t in graph.tensors if t.role != "activation" and t.name not in env]
    if missing:
        raise GraphError(f"graph {graph.name}: no value fed for tensor {missing[0]!r}")
    for op in graph.operators:
        args = [env[o.tensor] for o in op.inputs]
        if on_input is not None:
            args = [on_input(op, k, a) for k, a in enumerate(args)]
        for k, (operand, value) in enumerate(zip(op.outputs, run_operator(op, args, xp))):
            env[operand.tensor] = on_output(op, k, value) if on_output is not None else value
    return env


def random_feeds(graph: Graph, seed: int = 0, dtype: str = "float64") -> dict[str, Any]:
    """Deterministic numpy values for every param and data tensor (integers index their table)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds = {}
    for t in graph.tensors:
        if t.role == "activation":
            continue
        if t.integer:
            feeds[t.name] = rng.integers(0, _index_bound(graph, t.name), size=t.shape).astype(
                np.int32
            )
        else:
            scale = 1.0 / math.sqrt(t.shape[0]) if t.role == "param" and len(t.shape) > 1 else 1.0
            feeds[t.name] = (rng.standard_normal(t.shape) * scale).astype(dtype)
    return feeds


def _index_bound(graph: Graph, tensor: str) -> int:
    """The size of the table an integer tensor indexes (embedding rows, classes of a loss)."""
    for op in graph.operators:
        for k, operand in enumerate(op.inputs):
            if operand.tensor == tensor and op.kind == "embedding":
                return graph.tensor(op.inputs[1].tensor).shape[0]
            if operand.tensor == tensor and op.kind == "cross_entropy":
                return graph.tensor(op.inputs[0].tensor).shape[-1]
    return 2
