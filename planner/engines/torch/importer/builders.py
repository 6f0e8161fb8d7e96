"""The mapping helpers the ATen handlers share: elementwise operators, views, permutes,
contractions and matmuls, normalisations, convolutions and pools, splits, each fx node turned into
IR operators through the ``ImportState``."""

from __future__ import annotations

from typing import Sequence

from planner.engines.torch.importer.state import LETTERS, ImportState


def elementwise(imp: ImportState, node, kind: str, tensors: list[str]) -> None:
    shape = list(node.meta["val"].shape)
    out = imp.letters(len(shape), shape[0] if shape else None)
    sizes = dict(zip(out, shape))
    fresh = iter(LETTERS[len(out) :])
    operands = [imp.broadcast_operand(imp.gb.shape(t), out, sizes, fresh) for t in tensors]
    imp.add(kind, node, ",".join(operands) + "->" + "".join(out), tensors, sizes)


def view_of(imp: ImportState, node, source: str) -> None:
    """A reshape of ``source`` as the node gives it: merges and splits of neighbouring dims."""
    src, dst = list(imp.gb.shape(source)), list(node.meta["val"].shape)
    blocks = view_blocks(src, dst)
    if blocks is None:  # not a merge/split of neighbours: flatten, then unflatten
        letters = imp.letters(len(src))
        flat = imp.gb.op(
            "reshape",
            f"{node.name}.flatten",
            "".join(letters) + "->(" + "".join(letters) + ")",
            [source],
            out=f"{node.name}.flat",
        )
        imp.kind[flat] = "activation"
        letters = imp.letters(len(dst))
        imp.add(
            "reshape",
            node,
            "(" + "".join(letters) + ")->" + "".join(letters),
            [flat],
            dict(zip(letters, dst)),
        )
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


def permute(imp: ImportState, node, source: str, order: Sequence[int]) -> None:
    shape = imp.gb.shape(source)
    letters = imp.letters(len(shape), shape[0] if order[0] == 0 else None)
    imp.add(
        "transpose",
        node,
        "".join(letters) + "->" + "".join(letters[i] for i in order),
        [source],
        dict(zip(letters, shape)),
    )


def contraction(
    imp: ImportState, node, x: str, w: str, bias: str | None, weight_out_first: bool
) -> None:
    """x[..., k] with w[o, k] (linear) or w[k, o] (addmm/mm), plus a bias over o."""
    shape = imp.gb.shape(x)
    lead = imp.letters(len(shape) + 1, shape[0] if len(shape) > 1 else None)
    batch, k, o = lead[:-2], lead[-2], lead[-1]
    sizes = dict(zip(batch + [k], shape))
    sizes[o] = node.meta["val"].shape[-1]
    weight = o + k if weight_out_first else k + o
    eq = "".join(batch) + k + "," + weight + ("," + o if bias else "") + "->" + "".join(batch) + o
    imp.add("linear", node, eq, [x, w] + ([bias] if bias else []), sizes)


def matmul(imp: ImportState, node, a: str, b: str) -> None:
    sa, sb, so = imp.gb.shape(a), imp.gb.shape(b), list(node.meta["val"].shape)
    if len(sa) < 2 or len(sb) < 2:
        return imp.unknown(node, [a, b])
    out = imp.letters(len(so) + 1, so[0] if len(so) > 2 else None)
    k = out.pop()
    sizes = dict(zip(out, so))
    sizes[k] = sa[-1]
    fresh = iter(LETTERS[len(out) + 1 :])
    batch = out[:-2]
    ta = imp.broadcast_operand(sa[:-2], batch, sizes, fresh) + out[-2] + k
    tb = imp.broadcast_operand(sb[:-2], batch, sizes, fresh) + k + out[-1]
    imp.add(
        "batch_matmul" if batch else "matmul", node, f"{ta},{tb}->{''.join(out)}", [a, b], sizes
    )


def normalize(
    imp: ImportState,
    node,
    kind: str,
    x: str,
    norm_dims: Sequence[int],
    params: list[str],
    channel: int = -1,
) -> None:
    shape = imp.gb.shape(x)
    letters = imp.letters(len(shape), shape[0])
    sizes = dict(zip(letters, shape))
    own = "".join(letters)
    if kind == "batchnorm":
        param_text = letters[channel]
        spatial = "".join(x for i, x in enumerate(letters) if i not in (0, channel))
        imp.add(
            kind,
            node,
            ",".join([own] + [param_text] * len(params)) + "->" + own,
            [x] + params,
            sizes,
            unsplittable=spatial,
        )
        return
    norm = "".join(letters[d % len(shape)] for d in norm_dims)
    param_text = norm
    imp.add(
        kind,
        node,
        ",".join([own] + [param_text] * len(params)) + "->" + own,
        [x] + params,
        sizes,
        norm=norm,
    )


def conv(
    imp: ImportState, node, x: str, w: str, bias: str | None, stride, padding, dilation, groups
) -> None:
    if groups != 1 or any(d != 1 for d in pair(dilation)) or len(imp.gb.shape(x)) != 4:
        return imp.unknown(node, [t for t in (x, w, bias) if t])
    _, _, p, q = node.meta["val"].shape
    o, _, r, t = imp.gb.shape(w)
    sizes = {"o": o, "r": r, "t": t, "p": p, "q": q}
    eq = "bcHW,ocrt" + (",o" if bias else "") + "->bopq"
    imp.add(
        "conv2d",
        node,
        eq,
        [x, w] + ([bias] if bias else []),
        sizes,
        attrs={"stride": pair(stride)[0], "padding": pair(padding)[0]},
    )


def maxpool(imp: ImportState, node, x: str, kernel, stride, padding) -> None:
    _, _, p, q = node.meta["val"].shape
    stride = pair(stride or kernel)[0]
    imp.add(
        "maxpool",
        node,
        "bcHW->bcpq",
        [x],
        {"p": p, "q": q},
        attrs={"kernel": pair(kernel)[0], "stride": stride, "padding": pair(padding)[0]},
    )


def avgpool_of(imp: ImportState, node, x: str) -> None:
    """A global average pool (output 1 x 1) as a mean over the spatial dims."""
    shape = list(node.meta["val"].shape)
    if len(shape) != 4 or shape[2:] != [1, 1]:
        return imp.unknown(node, [x])
    pooled = imp.gb.op("avgpool", f"{node.name}.mean", "bcHW->bc", [x], out=f"{node.name}.mean")
    imp.kind[pooled] = "activation"
    imp.add("reshape", node, "bc->bcyz", [pooled], {"y": 1, "z": 1})


def split(imp: ImportState, node, source: str, dim: int) -> bool:
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
    imp.gb.op(
        "split",
        node.name,
        src + "->" + ",".join(["".join(letters)] * len(pieces)),
        [source],
        sizes=sizes,
        out=outs,
        unsplittable=piece,
    )
    for i, out in enumerate(outs):
        imp.kind[out] = "activation"
        imp.value[f"{node.name}#{i}"] = out
    return True


def pair(value) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return (int(value[0]), int(value[-1])) if value else (1, 1)
    return int(value), int(value)


def view_blocks(src: list[int], dst: list[int]) -> list[tuple[list[int], list[int]]] | None:
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
