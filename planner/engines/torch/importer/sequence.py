"""ATen handlers for sequence models (LLaMA, T5, ViT, BERT): slices and selects, concatenation,
fused scaled-dot-product attention and reductions (mean/sum over dims, keepdim as a view)."""

from __future__ import annotations

from planner.engines.torch.importer.builders import avgpool_of, view_of
from planner.engines.torch.importer.handlers import input_tensors, register
from planner.engines.torch.importer.state import LETTERS, ImportState


def slice_or_select(imp: ImportState, node, op: str) -> None:
    """A contiguous piece of one dim: the dim becomes ``(pieces, length)``, the piece is an attr."""
    source = imp.tensor(node.args[0])
    shape = imp.gb.shape(source)
    if op == "slice" and tuple(node.meta["val"].shape) == shape:  # a full slice is an alias
        imp.value[node.name] = source
        return
    args = list(node.args) + [None] * 5
    dim = (args[1] or 0) % len(shape)
    if op == "select":
        start, length = args[2] % shape[dim], 1
    else:
        start = max(0, min(args[2] or 0, shape[dim]))
        length = min(shape[dim] if args[3] is None else args[3], shape[dim]) - start
    if (args[4] or 1) != 1 or length <= 0 or shape[dim] % length or start % length:
        return imp.unknown(node, input_tensors(imp, node))
    letters = imp.letters(len(shape) + 2, shape[0] if dim else None)
    piece, part = letters.pop(), letters.pop()
    sizes = dict(zip(letters, shape))
    sizes.update({piece: shape[dim] // length, part: length})
    src = "".join(x if i != dim else f"({piece}{part})" for i, x in enumerate(letters))
    dst = "".join(
        x if i != dim else ("" if op == "select" else part) for i, x in enumerate(letters)
    )
    imp.add(
        "slice",
        node,
        f"{src}->{dst}",
        [source],
        sizes,
        unsplittable=piece + part,
        attrs={"index": start // length},
    )


@register("select")
def _select(imp: ImportState, node, op: str) -> None:
    slice_or_select(imp, node, op)


@register("cat")
def _cat(imp: ImportState, node, op: str) -> None:
    """Equal pieces: the output dim is ``(pieces, length)``; unequal: each input's own dim,
    concatenated."""
    tensors = [imp.tensor(t) for t in node.args[0]]
    shapes = [imp.gb.shape(t) for t in tensors]
    out_shape = list(node.meta["val"].shape)
    dim = (node.args[1] if len(node.args) > 1 else 0) % len(out_shape)
    if any(t is None for t in tensors) or any(len(s) != len(out_shape) for s in shapes):
        return imp.unknown(node, [t for t in tensors if t])
    letters = imp.letters(len(out_shape), out_shape[0] if dim else None)
    sizes = dict(zip(letters, out_shape))
    fresh = iter(x for x in LETTERS if x not in letters)
    if all(s == shapes[0] for s in shapes):
        piece, part = next(fresh), letters[dim]
        sizes.update({piece: len(tensors), part: shapes[0][dim]})
        out = "".join(x if i != dim else f"({piece}{part})" for i, x in enumerate(letters))
        imp.add(
            "concat",
            node,
            ",".join(["".join(letters)] * len(tensors)) + "->" + out,
            tensors,
            sizes,
            unsplittable=piece + part,
        )
        return
    operands, own = [], []
    for shape in shapes:
        mine = next(fresh)
        sizes[mine] = shape[dim]
        own.append(mine)
        operands.append("".join(x if i != dim else mine for i, x in enumerate(letters)))
    imp.add(
        "concat",
        node,
        ",".join(operands) + "->" + "".join(letters),
        tensors,
        sizes,
        unsplittable="".join(own) + letters[dim],
    )


@register("scaled_dot_product_attention")
def _sdpa(imp: ImportState, node, op: str) -> None:
    """q [..., h, s, d], k and v [..., h, t, d] (same heads), an optional additive mask over (h, s,
    t)."""
    args = list(node.args) + [None] * 6
    q, k, v = (imp.tensor(a) for a in args[:3])
    mask = imp.tensor(args[3]) if args[3] is not None else imp.tensor(node.kwargs.get("attn_mask"))
    causal = bool(args[5] if args[5] is not None else node.kwargs.get("is_causal", False))
    sq, sk = imp.gb.shape(q), imp.gb.shape(k)
    if len(sq) < 3 or sq[:-2] != sk[:-2] or imp.gb.shape(v) != sk:
        return imp.unknown(node, [t for t in (q, k, v, mask) if t])
    letters = imp.letters(len(sq) + 1, sq[0] if len(sq) > 3 else None)
    key = letters.pop()
    sizes = dict(zip(letters, sq))
    sizes[key] = sk[-2]
    lead, query, head = "".join(letters[:-2]), letters[-2], letters[-1]
    operands = [lead + query + head, lead + key + head, lead + key + head]
    inputs = [q, k, v]
    if mask is not None:
        fresh = iter(x for x in LETTERS if x not in letters and x != key)
        operands.append(
            imp.broadcast_operand(imp.gb.shape(mask), list(lead + query + key), sizes, fresh)
        )
        inputs.append(mask)
    imp.add(
        "attention",
        node,
        ",".join(operands) + "->" + lead + query + head,
        inputs,
        sizes,
        unsplittable=key + head,
        attrs={"causal": int(causal)},
    )


@register("slice")
def _slice(imp: ImportState, node, op: str) -> None:
    slice_or_select(imp, node, op)


@register("mean")
def _mean(imp: ImportState, node, op: str) -> None:
    """Spatial means of an image ([b, c, 1, 1] out) are average pooling; other means are
    reductions."""
    source = imp.tensor(node.args[0])
    if len(imp.gb.shape(source)) == 4 and list(node.meta["val"].shape[2:]) == [1, 1]:
        return avgpool_of(imp, node, source)
    reduction(imp, node, "mean")


@register("sum")
def _sum(imp: ImportState, node, op: str) -> None:
    reduction(imp, node, "sum")


def reduction(imp: ImportState, node, op: str) -> None:
    """sum / mean over dims, keepdim as a view that re-inserts size-1 dims."""
    source = imp.tensor(node.args[0])
    shape = imp.gb.shape(source)
    dims = (
        node.args[1] if len(node.args) > 1 and node.args[1] is not None else list(range(len(shape)))
    )
    dims = {d % len(shape) for d in (dims if isinstance(dims, (list, tuple)) else [dims])}
    keep = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))
    letters = imp.letters(len(shape), shape[0] if 0 not in dims else None)
    sizes = dict(zip(letters, shape))
    kept = "".join(x for i, x in enumerate(letters) if i not in dims)
    kind = "reduce" if op == "sum" else "mean"
    if not keep:
        imp.add(kind, node, "".join(letters) + "->" + kept, [source], sizes)
        return
    reduced = imp.gb.op(
        kind,
        f"{node.name}.reduce",
        "".join(letters) + "->" + kept,
        [source],
        sizes=sizes,
        out=f"{node.name}.reduced",
    )
    imp.kind[reduced] = "activation"
    view_of(imp, node, reduced)
