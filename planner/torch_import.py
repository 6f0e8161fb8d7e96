"""Import a PyTorch ``nn.Module`` through ``torch.export`` into the IR (optional extra ``torch``).

Each ATen call of the exported program becomes one IR operator in einsum form, with letters
assigned per operator from the traced shapes: linear/addmm/matmul/bmm are contractions,
convolution is conv2d (stride and padding as attrs), embedding, layer_norm, softmax, batch_norm,
pooling, elementwise ops (broadcasting dims of size 1 get their own size-1 letter), and views
(view/reshape/flatten/unsqueeze/squeeze as groups of merged dims, transpose/permute, expand, split
into equal pieces). Names: parameters keep their module path (``transformer.h.0.attn.c_attn.weight``),
operators and activations the exported node name.

Conventions: a computation that reads no parameter and no activation (position ids, attention
masks built from the input ids) is folded into a ``data`` tensor: the planner does not shard it.
Aliases (``to``, ``alias``, ``clone``, ``contiguous``, ``dropout`` with p = 0 is kept as dropout)
map to their input. Buffers (batch-norm running statistics) are data. A training loss is added as
the sum of the first floating output (``reduce``). Elementwise functions are recorded by kind
(relu, gelu, unary, add, mul), not by formula: an imported graph plans and costs exactly, but the
interpreter runs its elementwise ops with the kind's default function. An ATen op outside this list
is an error naming it, or with ``allow_unknown`` an ``opaque`` operator whose dims are all
unsplittable (always replicated).
"""

from __future__ import annotations

import operator as pyop
from typing import Any, Sequence

from planner.errors import GraphError
from planner.graph import Graph
from planner.ops import GraphBuilder

LETTERS = "acdefgijklmnosuvwxyzABCDEFGIJKLMNOPQSUVXYZ"  # 'b' is the batch; conv/pool letters (HWpqrt) apart
ALIASES = {"to", "alias", "clone", "contiguous", "detach", "lift_fresh_copy", "_to_copy", "type_as"}
UNARY = {"relu": "relu", "gelu": "gelu", "dropout": "dropout", "tanh": "unary", "sigmoid": "unary", "silu": "unary",
         "exp": "unary", "neg": "unary", "rsqrt": "unary", "sqrt": "unary", "pow": "unary", "erf": "unary",
         "hardtanh": "unary", "relu_": "relu", "log": "unary", "abs": "unary", "square": "unary"}
BINARY = {"add": "add", "add_": "add", "sub": "add", "mul": "mul", "div": "mul", "where": "add", "maximum": "add",
          "minimum": "add"}
VIEWS = {"view", "reshape", "_unsafe_view", "flatten", "unsqueeze", "squeeze", "unflatten"}


class TorchImportError(GraphError):
    """An exported op the importer cannot map (names the op)."""


def _op_name(target: Any) -> str:
    text = str(getattr(target, "__name__", target))
    name = text.split(".")[1] if text.startswith("aten.") else text.split(".")[0]
    return name


class _Importer:
    def __init__(self, name: str, allow_unknown: bool) -> None:
        self.gb = GraphBuilder(name)
        self.allow_unknown = allow_unknown
        self.value: dict[str, str | float] = {}  # fx node name -> IR tensor name (or a python scalar)
        self.kind: dict[str, str] = {}  # IR tensor -> "param" | "data" | "activation"
        self.batch = 0  # dim 0 of the first user input: a leading dim of that size is named 'b'

    # ------------------------------------------------------------------ helpers

    def tensor(self, arg) -> str | None:
        name = getattr(arg, "name", None)
        value = self.value.get(name) if name else None
        return value if isinstance(value, str) else None

    def letters(self, count: int, first_size: int | None = None) -> list[str]:
        """Fresh letters for an operator; the first is 'b' when it has the batch size (so the
        data-parallel baseline, which splits 'b', applies to imported graphs)."""
        if count > len(LETTERS):
            raise TorchImportError(f"import: a tensor of rank {count} is beyond the {len(LETTERS)} einsum letters")
        if count and first_size is not None and first_size == self.batch:
            return ["b"] + list(LETTERS[:count - 1])
        return list(LETTERS[:count])

    def add(self, kind: str, node, equation: str, inputs: Sequence[str], sizes: dict[str, int], **extra) -> None:
        out = self.gb.op(kind, node.name, equation, list(inputs), sizes=sizes, out=node.name, **extra)
        want = tuple(node.meta["val"].shape)
        if self.gb.shape(out) != want:
            raise TorchImportError(f"import: operator {node.name} ({node.target}): shape {self.gb.shape(out)} != traced {want}")
        self.value[node.name] = out
        self.kind[out] = "activation"

    def broadcast_operand(self, shape: Sequence[int], out: list[str], sizes: dict[str, int], fresh) -> str:
        """Letters of an input aligned right to the output; broadcast size-1 dims get own letters."""
        offset = len(out) - len(shape)
        text = []
        for i, size in enumerate(shape):
            letter = out[offset + i]
            if size == sizes[letter]:
                text.append(letter)
            else:
                extra = next(fresh)
                sizes[extra] = size
                text.append(extra)
        return "".join(text)

    # ------------------------------------------------------------------ mappings

    def elementwise(self, node, kind: str, tensors: list[str]) -> None:
        shape = list(node.meta["val"].shape)
        out = self.letters(len(shape), shape[0] if shape else None)
        sizes = dict(zip(out, shape))
        fresh = iter(LETTERS[len(out):])
        operands = [self.broadcast_operand(self.gb.shape(t), out, sizes, fresh) for t in tensors]
        self.add(kind, node, ",".join(operands) + "->" + "".join(out), tensors, sizes)

    def view(self, node, source: str) -> None:
        src, dst = list(self.gb.shape(source)), list(node.meta["val"].shape)
        blocks = _view_blocks(src, dst)
        if blocks is None:  # not a merge/split of neighbours: flatten, then unflatten
            letters = self.letters(len(src))
            flat = self.gb.op("reshape", f"{node.name}.flatten", "".join(letters) + "->(" + "".join(letters) + ")",
                              [source], out=f"{node.name}.flat")
            self.kind[flat] = "activation"
            letters = self.letters(len(dst))
            self.add("reshape", node, "(" + "".join(letters) + ")->" + "".join(letters), [flat], dict(zip(letters, dst)))
            return
        keep_batch = blocks and blocks[0] == ([0], [0]) and src[0] == self.batch
        pool = iter((["b"] if keep_batch else []) + list(LETTERS))
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
        self.add("reshape", node, "".join(src_text) + "->" + "".join(dst_text), [source], sizes)

    def permute(self, node, source: str, order: Sequence[int]) -> None:
        shape = self.gb.shape(source)
        letters = self.letters(len(shape), shape[0] if order[0] == 0 else None)
        self.add("transpose", node, "".join(letters) + "->" + "".join(letters[i] for i in order), [source],
                 dict(zip(letters, shape)))

    def contraction(self, node, x: str, w: str, bias: str | None, weight_out_first: bool) -> None:
        """x[..., k] with w[o, k] (linear) or w[k, o] (addmm/mm), plus a bias over o."""
        shape = self.gb.shape(x)
        lead = self.letters(len(shape) + 1, shape[0] if len(shape) > 1 else None)
        batch, k, o = lead[:-2], lead[-2], lead[-1]
        sizes = dict(zip(batch + [k], shape))
        sizes[o] = node.meta["val"].shape[-1]
        weight = o + k if weight_out_first else k + o
        eq = "".join(batch) + k + "," + weight + ("," + o if bias else "") + "->" + "".join(batch) + o
        self.add("linear", node, eq, [x, w] + ([bias] if bias else []), sizes)

    def matmul(self, node, a: str, b: str) -> None:
        sa, sb, so = self.gb.shape(a), self.gb.shape(b), list(node.meta["val"].shape)
        if len(sa) < 2 or len(sb) < 2:
            return self.unknown(node, [a, b])
        out = self.letters(len(so) + 1, so[0] if len(so) > 2 else None)
        k = out.pop()
        sizes = dict(zip(out, so))
        sizes[k] = sa[-1]
        fresh = iter(LETTERS[len(out) + 1:])
        batch = out[:-2]
        ta = self.broadcast_operand(sa[:-2], batch, sizes, fresh) + out[-2] + k
        tb = self.broadcast_operand(sb[:-2], batch, sizes, fresh) + k + out[-1]
        self.add("batch_matmul" if batch else "matmul", node, f"{ta},{tb}->{''.join(out)}", [a, b], sizes)

    def normalize(self, node, kind: str, x: str, norm_dims: Sequence[int], params: list[str], channel: int = -1) -> None:
        shape = self.gb.shape(x)
        letters = self.letters(len(shape), shape[0])
        sizes = dict(zip(letters, shape))
        own = "".join(letters)
        if kind == "batchnorm":
            param_text = letters[channel]
            spatial = "".join(x for i, x in enumerate(letters) if i not in (0, channel))
            self.add(kind, node, ",".join([own] + [param_text] * len(params)) + "->" + own, [x] + params, sizes,
                     unsplittable=spatial)
            return
        norm = "".join(letters[d % len(shape)] for d in norm_dims)
        param_text = norm
        self.add(kind, node, ",".join([own] + [param_text] * len(params)) + "->" + own, [x] + params, sizes, norm=norm)

    def conv(self, node, x: str, w: str, bias: str | None, stride, padding, dilation, groups) -> None:
        if groups != 1 or any(d != 1 for d in _pair(dilation)) or len(self.gb.shape(x)) != 4:
            return self.unknown(node, [t for t in (x, w, bias) if t])
        _, _, p, q = node.meta["val"].shape
        o, _, r, t = self.gb.shape(w)
        sizes = {"o": o, "r": r, "t": t, "p": p, "q": q}
        eq = "bcHW,ocrt" + (",o" if bias else "") + "->bopq"
        self.add("conv2d", node, eq, [x, w] + ([bias] if bias else []), sizes,
                 attrs={"stride": _pair(stride)[0], "padding": _pair(padding)[0]})

    def maxpool(self, node, x: str, kernel, stride, padding) -> None:
        _, _, p, q = node.meta["val"].shape
        stride = _pair(stride or kernel)[0]
        self.add("maxpool", node, "bcHW->bcpq", [x], {"p": p, "q": q},
                 attrs={"kernel": _pair(kernel)[0], "stride": stride, "padding": _pair(padding)[0]})

    def avgpool(self, node, x: str) -> None:
        shape = list(node.meta["val"].shape)
        if len(shape) != 4 or shape[2:] != [1, 1]:
            return self.unknown(node, [x])
        pooled = self.gb.op("avgpool", f"{node.name}.mean", "bcHW->bc", [x], out=f"{node.name}.mean")
        self.kind[pooled] = "activation"
        self.add("reshape", node, "bc->bcyz", [pooled], {"y": 1, "z": 1})

    def split(self, node, source: str, dim: int) -> bool:
        shape = list(self.gb.shape(source))
        pieces = list(node.meta["val"])
        dim %= len(shape)
        if any(tuple(p.shape) != tuple(pieces[0].shape) for p in pieces):
            return False
        letters = self.letters(len(shape) + 1)
        piece = letters.pop()
        sizes = dict(zip(letters, shape))
        sizes[letters[dim]] = pieces[0].shape[dim]
        sizes[piece] = len(pieces)
        src = "".join(x if i != dim else f"({piece}{x})" for i, x in enumerate(letters))
        outs = [f"{node.name}.{i}" for i in range(len(pieces))]
        self.gb.op("split", node.name, src + "->" + ",".join(["".join(letters)] * len(pieces)), [source],
                   sizes=sizes, out=outs, unsplittable=piece)
        for i, out in enumerate(outs):
            self.kind[out] = "activation"
            self.value[f"{node.name}#{i}"] = out
        return True

    def unknown(self, node, tensors: list[str]) -> None:
        target = str(node.target)
        if not self.allow_unknown:
            raise TorchImportError(f"import: unsupported operator {target} at node {node.name} "
                               "(pass --allow-unknown to plan it as a replicated opaque operator)")
        val = node.meta.get("val")
        if not hasattr(val, "shape"):
            raise TorchImportError(f"import: unsupported multi-output operator {target} at node {node.name}")
        pool = iter(LETTERS)
        sizes, operands = {}, []
        for t in tensors:
            text = "".join(next(pool) for _ in self.gb.shape(t))
            sizes.update(zip(text, self.gb.shape(t)))
            operands.append(text)
        out = "".join(next(pool) for _ in val.shape)
        sizes.update(zip(out, val.shape))
        self.add("opaque", node, ",".join(operands) + "->" + out, tensors, sizes, unsplittable="".join(sizes))


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


def _float(val) -> bool:
    return hasattr(val, "dtype") and val.dtype.is_floating_point


def import_module(module, example_inputs: tuple, *, name: str = "", allow_unknown: bool = False,
                  kwargs: dict | None = None) -> Graph:
    """Export ``module`` with ``example_inputs`` (``torch.export``) and translate it into a Graph."""
    try:
        import torch
    except ImportError:
        raise TorchImportError("import: PyTorch is not installed (pip install -e '.[torch]')") from None
    module = module.eval()
    program = torch.export.export(module, tuple(example_inputs), kwargs=kwargs or {})
    return import_program(program, name or type(module).__name__.lower(), allow_unknown)


def import_program(program, name: str, allow_unknown: bool = False) -> Graph:
    """Translate an ``ExportedProgram`` (see the module docstring for the conventions)."""
    imp = _Importer(name, allow_unknown)
    specs = {s.arg.name: s for s in program.graph_signature.input_specs}
    nodes = list(program.graph.nodes)
    used = {a.name for n in nodes for a in n.all_input_nodes}
    for node in nodes:
        if node.op == "placeholder":
            _placeholder(imp, node, specs.get(node.name), node.name in used)
        elif node.op == "call_function":
            _call(imp, node)
    outputs = [a for a in nodes if a.op == "output"][0].args[0]
    first = next((o for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])
                  if hasattr(o, "name") and imp.kind.get(imp.value.get(o.name)) == "activation"), None)
    if first is None:
        raise TorchImportError("import: the module returns no floating tensor computed from its parameters")
    out = imp.value[first.name]
    letters = "".join(LETTERS[: len(imp.gb.shape(out))])
    imp.gb.op("reduce", "loss", f"{letters}->", [out], out="loss")
    return imp.gb.build()


def _placeholder(imp: _Importer, node, spec, used: bool) -> None:
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


def _call(imp: _Importer, node) -> None:
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
    _map(imp, node, _op_name(target))


def _fold_data(imp: _Importer, node) -> None:
    """A value computed from data only (masks, position ids) becomes a data tensor."""
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        for i, v in enumerate(val):
            if hasattr(v, "shape"):
                name = imp.gb.data(f"{node.name}.{i}", tuple(v.shape) or (1,), integer=not _float(v))
                imp.kind[name] = "data"
                imp.value[f"{node.name}#{i}"] = name
        return
    if not hasattr(val, "shape"):
        imp.value[node.name] = val
        return
    name = imp.gb.data(node.name, tuple(val.shape) or (1,), integer=not _float(val))
    imp.kind[name] = "data"
    imp.value[node.name] = name


def _map(imp: _Importer, node, op: str) -> None:
    args = node.args
    t = imp.tensor
    if op in ALIASES or (op == "slice" and tuple(node.meta["val"].shape) == imp.gb.shape(t(args[0]))):
        imp.value[node.name] = t(args[0])
    elif op == "linear":
        imp.contraction(node, t(args[0]), t(args[1]), t(args[2]) if len(args) > 2 and args[2] is not None else None, True)
    elif op == "addmm":
        imp.contraction(node, t(args[1]), t(args[2]), t(args[0]), False)
    elif op in ("mm", "matmul", "bmm"):
        imp.matmul(node, t(args[0]), t(args[1]))
    elif op in ("conv2d", "convolution"):
        full = list(args) + [None, None, None, 1, 0, 1, False, 0, 1][len(args):]  # conv2d / convolution defaults
        groups = full[8] if op == "convolution" else (full[6] if len(args) > 6 else 1)
        imp.conv(node, t(full[0]), t(full[1]), t(full[2]) if full[2] is not None else None, full[3], full[4], full[5],
                 groups)
    elif op == "embedding":
        ids, table = t(args[1]), t(args[0])
        lead = imp.letters(len(imp.gb.shape(ids)) + 2, imp.gb.shape(ids)[0])
        v, h = lead[-2], lead[-1]
        imp.add("embedding", node, "".join(lead[:-2]) + "," + v + h + "->" + "".join(lead[:-2]) + h, [ids, table],
                {v: imp.gb.shape(table)[0]})
    elif op == "layer_norm":
        dims = list(range(-len(args[1]), 0))
        params = [t(a) for a in args[2:4] if a is not None and t(a)]
        imp.normalize(node, "layernorm", t(args[0]), dims, params)
    elif op in ("softmax", "_softmax", "log_softmax"):
        imp.normalize(node, "softmax", t(args[0]), [args[1]], [])
    elif op in ("batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm"):
        params = [t(a) for a in args[1:3] if a is not None and imp.kind.get(t(a)) == "param"]
        imp.normalize(node, "batchnorm", t(args[0]), [], params, channel=1)
    elif op in ("max_pool2d", "max_pool2d_with_indices"):
        imp.maxpool(node, t(args[0]), args[1], args[2] if len(args) > 2 else None, args[3] if len(args) > 3 else 0)
    elif op in ("adaptive_avg_pool2d", "mean") and len(imp.gb.shape(t(args[0]))) == 4:
        imp.avgpool(node, t(args[0]))
    elif op in VIEWS:
        imp.view(node, t(args[0]))
    elif op in ("transpose", "t"):
        rank = len(imp.gb.shape(t(args[0])))
        order = list(range(rank))
        a, b = (args[1] % rank, args[2] % rank) if op == "transpose" else (0, 1)
        order[a], order[b] = order[b], order[a]
        imp.permute(node, t(args[0]), order)
    elif op == "permute":
        imp.permute(node, t(args[0]), [d % len(args[1]) for d in args[1]])
    elif op == "expand":
        imp.elementwise(node, "add", [t(args[0])])
    elif op in ("split", "split_with_sizes", "chunk") and imp.split(node, t(args[0]), args[2] if len(args) > 2 else 0):
        pass
    elif op in UNARY or (op in BINARY and len([a for a in node.all_input_nodes if imp.tensor(a)]) == 1):
        imp.elementwise(node, UNARY.get(op, "unary"), [t(a) for a in node.all_input_nodes if t(a)])
    elif op in BINARY:
        imp.elementwise(node, BINARY[op], [t(a) for a in node.all_input_nodes if t(a)])
    else:
        imp.unknown(node, [t(a) for a in node.all_input_nodes if t(a)])

