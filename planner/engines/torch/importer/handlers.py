"""ATen handlers: one small function per ATen op family, registered in ``HANDLERS`` by op name
(the way DTensor registers sharding strategies per op). A handler maps one fx node to IR operators
through the ``ImportState``; an op without a handler is an error, or an opaque operator."""

from __future__ import annotations

from typing import Callable, Sequence

from planner.engines.torch.importer.state import LETTERS, ImportState

Handler = Callable[[ImportState, object, str], None]
HANDLERS: dict[str, Handler] = {}

UNARY = {"relu": "relu", "gelu": "gelu", "dropout": "dropout", "tanh": "unary", "sigmoid": "unary", "silu": "silu",
         "exp": "unary", "neg": "unary", "rsqrt": "unary", "sqrt": "unary", "pow": "unary", "erf": "unary",
         "cos": "unary", "sin": "unary", "reciprocal": "unary",
         "hardtanh": "unary", "relu_": "relu", "log": "unary", "abs": "unary", "square": "unary"}
BINARY = {"add": "add", "add_": "add", "sub": "add", "mul": "mul", "mul_": "mul", "div": "mul", "div_": "mul",
          "where": "add", "maximum": "add", "minimum": "add"}
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


# ---------------------------------------------------------------- mapping helpers

def _elementwise(imp: ImportState, node, kind: str, tensors: list[str]) -> None:
    shape = list(node.meta["val"].shape)
    out = imp.letters(len(shape), shape[0] if shape else None)
    sizes = dict(zip(out, shape))
    fresh = iter(LETTERS[len(out):])
    operands = [imp.broadcast_operand(imp.gb.shape(t), out, sizes, fresh) for t in tensors]
    imp.add(kind, node, ",".join(operands) + "->" + "".join(out), tensors, sizes)

def view_of(imp: ImportState, node, source: str) -> None:
    """A reshape of ``source`` as the node gives it: merges and splits of neighbouring dims."""
    src, dst = list(imp.gb.shape(source)), list(node.meta["val"].shape)
    blocks = _view_blocks(src, dst)
    if blocks is None:  # not a merge/split of neighbours: flatten, then unflatten
        letters = imp.letters(len(src))
        flat = imp.gb.op("reshape", f"{node.name}.flatten", "".join(letters) + "->(" + "".join(letters) + ")",
                          [source], out=f"{node.name}.flat")
        imp.kind[flat] = "activation"
        letters = imp.letters(len(dst))
        imp.add("reshape", node, "(" + "".join(letters) + ")->" + "".join(letters), [flat], dict(zip(letters, dst)))
        return
    keep_batch = blocks and blocks[0] == ([0], [0]) and src[0] == imp.batch
    pool = iter(([imp.batch_dim] if keep_batch else []) + list(LETTERS))
    src_text, dst_text, sizes = [], [], {}
    for si, dj in blocks:
        if len(si) <= 1 and dj:  # one dim split into several (or a new size-1 dim)
            letters = [next(pool) for _ in dj]
            sizes.update({x: dst[j] for x, j in zip(letters, dj)})
            dst_text += letters
            if si:
                src_text.append(letters[0] if len(letters) == 1 else "(" + "".join(letters) + ")")
        else:  # several dims merged into one (or a dropped size-1 dim)
            letters = [next(pool) for _ in si]
            sizes.update({x: src[i] for x, i in zip(letters, si)})
            src_text += letters
            if dj:
                dst_text.append(letters[0] if len(letters) == 1 else "(" + "".join(letters) + ")")
    imp.add("reshape", node, "".join(src_text) + "->" + "".join(dst_text), [source], sizes)

def _permute(imp: ImportState, node, source: str, order: Sequence[int]) -> None:
    shape = imp.gb.shape(source)
    letters = imp.letters(len(shape), shape[0] if order[0] == 0 else None)
    imp.add("transpose", node, "".join(letters) + "->" + "".join(letters[i] for i in order), [source],
             dict(zip(letters, shape)))

def _contraction(imp: ImportState, node, x: str, w: str, bias: str | None, weight_out_first: bool) -> None:
    """x[..., k] with w[o, k] (linear) or w[k, o] (addmm/mm), plus a bias over o."""
    shape = imp.gb.shape(x)
    lead = imp.letters(len(shape) + 1, shape[0] if len(shape) > 1 else None)
    batch, k, o = lead[:-2], lead[-2], lead[-1]
    sizes = dict(zip(batch + [k], shape))
    sizes[o] = node.meta["val"].shape[-1]
    weight = o + k if weight_out_first else k + o
    eq = "".join(batch) + k + "," + weight + ("," + o if bias else "") + "->" + "".join(batch) + o
    imp.add("linear", node, eq, [x, w] + ([bias] if bias else []), sizes)

def _matmul(imp: ImportState, node, a: str, b: str) -> None:
    sa, sb, so = imp.gb.shape(a), imp.gb.shape(b), list(node.meta["val"].shape)
    if len(sa) < 2 or len(sb) < 2:
        return imp.unknown(node, [a, b])
    out = imp.letters(len(so) + 1, so[0] if len(so) > 2 else None)
    k = out.pop()
    sizes = dict(zip(out, so))
    sizes[k] = sa[-1]
    fresh = iter(LETTERS[len(out) + 1:])
    batch = out[:-2]
    ta = imp.broadcast_operand(sa[:-2], batch, sizes, fresh) + out[-2] + k
    tb = imp.broadcast_operand(sb[:-2], batch, sizes, fresh) + k + out[-1]
    imp.add("batch_matmul" if batch else "matmul", node, f"{ta},{tb}->{''.join(out)}", [a, b], sizes)

def _normalize(imp: ImportState, node, kind: str, x: str, norm_dims: Sequence[int], params: list[str], channel: int = -1) -> None:
    shape = imp.gb.shape(x)
    letters = imp.letters(len(shape), shape[0])
    sizes = dict(zip(letters, shape))
    own = "".join(letters)
    if kind == "batchnorm":
        param_text = letters[channel]
        spatial = "".join(x for i, x in enumerate(letters) if i not in (0, channel))
        imp.add(kind, node, ",".join([own] + [param_text] * len(params)) + "->" + own, [x] + params, sizes,
                 unsplittable=spatial)
        return
    norm = "".join(letters[d % len(shape)] for d in norm_dims)
    param_text = norm
    imp.add(kind, node, ",".join([own] + [param_text] * len(params)) + "->" + own, [x] + params, sizes, norm=norm)

def _conv(imp: ImportState, node, x: str, w: str, bias: str | None, stride, padding, dilation, groups) -> None:
    if groups != 1 or any(d != 1 for d in _pair(dilation)) or len(imp.gb.shape(x)) != 4:
        return imp.unknown(node, [t for t in (x, w, bias) if t])
    _, _, p, q = node.meta["val"].shape
    o, _, r, t = imp.gb.shape(w)
    sizes = {"o": o, "r": r, "t": t, "p": p, "q": q}
    eq = "bcHW,ocrt" + (",o" if bias else "") + "->bopq"
    imp.add("conv2d", node, eq, [x, w] + ([bias] if bias else []), sizes,
             attrs={"stride": _pair(stride)[0], "padding": _pair(padding)[0]})

def _maxpool(imp: ImportState, node, x: str, kernel, stride, padding) -> None:
    _, _, p, q = node.meta["val"].shape
    stride = _pair(stride or kernel)[0]
    imp.add("maxpool", node, "bcHW->bcpq", [x], {"p": p, "q": q},
             attrs={"kernel": _pair(kernel)[0], "stride": stride, "padding": _pair(padding)[0]})

def avgpool_of(imp: ImportState, node, x: str) -> None:
    """A global average pool (output 1 x 1) as a mean over the spatial dims."""
    shape = list(node.meta["val"].shape)
    if len(shape) != 4 or shape[2:] != [1, 1]:
        return imp.unknown(node, [x])
    pooled = imp.gb.op("avgpool", f"{node.name}.mean", "bcHW->bc", [x], out=f"{node.name}.mean")
    imp.kind[pooled] = "activation"
    imp.add("reshape", node, "bc->bcyz", [pooled], {"y": 1, "z": 1})

def _split(imp: ImportState, node, source: str, dim: int) -> bool:
    shape = list(imp.gb.shape(source))
    pieces = list(node.meta["val"])
    dim %= len(shape)
    if any(tuple(p.shape) != tuple(pieces[0].shape) for p in pieces):
        return False
    letters = imp.letters(len(shape) + 1)
    piece = letters.pop()
    sizes = dict(zip(letters, shape))
    sizes[letters[dim]] = pieces[0].shape[dim]
    sizes[piece] = len(pieces)
    src = "".join(x if i != dim else f"({piece}{x})" for i, x in enumerate(letters))
    outs = [f"{node.name}.{i}" for i in range(len(pieces))]
    imp.gb.op("split", node.name, src + "->" + ",".join(["".join(letters)] * len(pieces)), [source],
               sizes=sizes, out=outs, unsplittable=piece)
    for i, out in enumerate(outs):
        imp.kind[out] = "activation"
        imp.value[f"{node.name}#{i}"] = out
    return True


def _pair(value) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return (int(value[0]), int(value[-1])) if value else (1, 1)
    return int(value), int(value)


def _view_blocks(src: list[int], dst: list[int]) -> list[tuple[list[int], list[int]]] | None:
    """Blocks of neighbouring dims with equal products: ([src dims], [dst dims]); None if a block
    mixes several dims on both sides (a general reshape)."""
    blocks, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1 and (j >= len(dst) or dst[j] != 1):
            blocks.append(([i], []))
            i += 1
            continue
        if j < len(dst) and dst[j] == 1 and (i >= len(src) or src[i] != 1):
            blocks.append(([], [j]))
            j += 1
            continue
        if i >= len(src) or j >= len(dst):
            return None
        si, dj, pa, pb = [i], [j], src[i], dst[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(src):
                si.append(i)
                pa *= src[i]
                i += 1
            elif pb < pa and j < len(dst):
                dj.append(j)
                pb *= dst[j]
                j += 1
            else:
                return None
        if len(si) > 1 and len(dj) > 1:
            return None
        blocks.append((si, dj))
    return blocks


# ---------------------------------------------------------------- handlers, one per op family


@register(*ALIASES)
def _alias(imp: ImportState, node, op: str) -> None:
    imp.value[node.name] = imp.tensor(node.args[0])




@register("linear")
def _linear(imp: ImportState, node, op: str) -> None:
    args = node.args
    _contraction(imp, node, imp.tensor(args[0]), imp.tensor(args[1]), _optional(imp, args, 2), True)


@register("addmm")
def _addmm(imp: ImportState, node, op: str) -> None:
    args = node.args
    _contraction(imp, node, imp.tensor(args[1]), imp.tensor(args[2]), imp.tensor(args[0]), False)


@register("mm", "matmul", "bmm")
def _matmuls(imp: ImportState, node, op: str) -> None:
    _matmul(imp, node, imp.tensor(node.args[0]), imp.tensor(node.args[1]))


@register("conv2d", "convolution")
def _convolution(imp: ImportState, node, op: str) -> None:
    args = node.args
    full = list(args) + [None, None, None, 1, 0, 1, False, 0, 1][len(args):]  # conv2d / convolution defaults
    groups = full[8] if op == "convolution" else (full[6] if len(args) > 6 else 1)
    t = imp.tensor
    _conv(imp, node, t(full[0]), t(full[1]), t(full[2]) if full[2] is not None else None, full[3], full[4], full[5],
          groups)


@register("embedding")
def _embedding(imp: ImportState, node, op: str) -> None:
    ids, table = imp.tensor(node.args[1]), imp.tensor(node.args[0])
    lead = imp.letters(len(imp.gb.shape(ids)) + 2, imp.gb.shape(ids)[0])
    v, h = lead[-2], lead[-1]
    imp.add("embedding", node, "".join(lead[:-2]) + "," + v + h + "->" + "".join(lead[:-2]) + h, [ids, table],
            {v: imp.gb.shape(table)[0]})


@register("layer_norm")
def _layer_norm(imp: ImportState, node, op: str) -> None:
    args = node.args
    params = [imp.tensor(a) for a in args[2:4] if a is not None and imp.tensor(a)]
    _normalize(imp, node, "layernorm", imp.tensor(args[0]), list(range(-len(args[1]), 0)), params)


@register("softmax", "_softmax", "log_softmax")
def _softmax(imp: ImportState, node, op: str) -> None:
    _normalize(imp, node, "softmax", imp.tensor(node.args[0]), [node.args[1]], [])


@register("batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm")
def _batch_norm(imp: ImportState, node, op: str) -> None:
    args = node.args
    params = [imp.tensor(a) for a in args[1:3] if a is not None and imp.kind.get(imp.tensor(a)) == "param"]
    _normalize(imp, node, "batchnorm", imp.tensor(args[0]), [], params, channel=1)


@register("max_pool2d", "max_pool2d_with_indices")
def _max_pool(imp: ImportState, node, op: str) -> None:
    args = node.args
    _maxpool(imp, node, imp.tensor(args[0]), args[1], args[2] if len(args) > 2 else None, args[3] if len(args) > 3 else 0)


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
    _permute(imp, node, imp.tensor(args[0]), order)


@register("permute")
def _permute_op(imp: ImportState, node, op: str) -> None:
    _permute(imp, node, imp.tensor(node.args[0]), [d % len(node.args[1]) for d in node.args[1]])


@register("expand")
def _expand(imp: ImportState, node, op: str) -> None:
    _elementwise(imp, node, "add", [imp.tensor(node.args[0])])


@register("split", "split_with_sizes", "chunk")
def _splits(imp: ImportState, node, op: str) -> None:
    args = node.args
    if not _split(imp, node, imp.tensor(args[0]), args[2] if len(args) > 2 else 0):
        imp.unknown(node, input_tensors(imp, node))


@register(*UNARY)
def _unary(imp: ImportState, node, op: str) -> None:
    _elementwise(imp, node, UNARY[op], input_tensors(imp, node))


@register(*BINARY)
def _binary(imp: ImportState, node, op: str) -> None:
    tensors = input_tensors(imp, node)
    _elementwise(imp, node, BINARY[op] if len(tensors) > 1 else "unary", tensors)  # with a scalar: unary
