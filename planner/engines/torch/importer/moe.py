"""Top-k routed mixtures of experts (transformers' Mixtral block) mapped onto GShard's operators.

transformers routes with ``topk`` over the router probabilities, then sorts the (token, expert)
pairs, gathers the tokens, runs one grouped matmul per projection and scatters the results back
(data-dependent shapes that no einsum states). The handler for ``topk`` takes that whole region,
from ``topk`` to the sum over the k picks that returns one row per token, and writes instead what it
computes in GShard's terms: a capacity gate over the probabilities, the dispatch to the experts, the
experts' SwiGLU (gate/up projection, split, SiLU, product, down projection) on the grouped weights,
and the combine. The flattened token rows are read as batch x sequence (the batch of the first
input), so data parallelism splits them; the capacity is k x seq / experts per sequence, as the
zoo's MoE.
"""

from __future__ import annotations

import math

from planner.engines.torch.importer.handlers import register
from planner.engines.torch.importer.state import ImportState


def _region(topk) -> tuple[set[str], object | None]:
    """Names of the nodes computed from ``topk`` up to the per-token sum, and that sum node."""
    seen, frontier, end = set(), [topk], None
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if user.name in seen:
                continue
            seen.add(user.name)
            if _combines(user, topk):
                end = user
                continue
            frontier.append(user)
    return seen, end


def _combines(node, topk) -> bool:
    """The sum over the k picks of [tokens, k, hidden] rows: back to one row per token."""
    if "sum" not in str(node.target) or not node.args or not hasattr(node.args[0], "meta"):
        return False
    source = getattr(node.args[0].meta.get("val"), "shape", ())
    tokens = topk.meta["val"][0].shape[0]
    return (
        len(source) == 3
        and tuple(source[:2]) == (tokens, topk.args[1])
        and tuple(node.meta["val"].shape) == (tokens, source[2])
    )


def _grouped(region: set[str], topk) -> list:
    graph_nodes = list(topk.graph.nodes)
    return [n for n in graph_nodes if n.name in region and "grouped_mm" in str(n.target)]


@register("topk")
def _topk(imp: ImportState, node, op: str) -> None:
    region, end = _region(node)
    matmuls = _grouped(region, node)
    tokens_src = next(
        (
            n
            for n in node.graph.nodes
            if n.name in region
            and str(n.target) == "aten.index.Tensor"
            and imp.tensor(n.args[0]) is not None
        ),
        None,
    )
    if end is None or len(matmuls) != 2 or tokens_src is None:
        return imp.unknown(node, [imp.tensor(node.args[0])])
    probs, x2d = imp.tensor(node.args[0]), imp.tensor(tokens_src.args[0])
    # grouped_mm(x, transpose(param), offsets)
    weights = [imp.tensor(m.args[1].args[0]) for m in matmuls]
    if None in weights or len(imp.gb.shape(probs)) != 2:
        return imp.unknown(node, [probs])
    tokens, experts = imp.gb.shape(probs)
    hidden = imp.gb.shape(x2d)[1]
    _, double, _ = imp.gb.shape(weights[0])  # [e, 2 f, h]
    k = node.args[1]
    # the flattened rows are batch x seq
    batch = imp.batch if imp.batch and tokens % imp.batch == 0 else 1
    capacity = max(1, math.ceil(k * (tokens // batch) / experts))
    sizes = {
        "b": batch,
        "s": tokens // batch,
        "e": experts,
        "h": hidden,
        "c": capacity,
        "g": double,
        "f": double // 2,
        "p": 2,
    }
    out = _expert_ops(imp, node.name, probs, x2d, weights, sizes)
    imp.skip |= region - {end.name}
    imp.skip.add(end.name)
    imp.value[end.name] = out


def _expert_ops(imp: ImportState, p: str, probs: str, x2d: str, weights: list, sizes: dict) -> str:
    """The IR of a top-k mixture of experts: gate, dispatch, each expert's SwiGLU MLP, combine."""
    gb = imp.gb
    logits = gb.op("reshape", f"{p}.probs3d", "(bs)e->bse", [probs], sizes=sizes)
    gate = gb.op("moe_gate", f"{p}.gate", "bse->bsec", [logits], sizes=sizes)
    x3 = gb.op("reshape", f"{p}.tokens3d", "(bs)h->bsh", [x2d], sizes=sizes)
    routed = gb.op("moe_dispatch", f"{p}.dispatch", "bsh,bsec->ebch", [x3, gate])
    both = gb.op("einsum", f"{p}.gate_up", "ebch,egh->ebcg", [routed, weights[0]], sizes=sizes)
    halves = [f"{p}.gate_half", f"{p}.up_half"]
    gb.op(
        "split",
        f"{p}.chunk",
        "ebc(pf)->ebcf,ebcf",
        [both],
        sizes=sizes,
        out=halves,
        unsplittable="p",
    )
    act = gb.op(
        "mul",
        f"{p}.swiglu",
        "ebcf,ebcf->ebcf",
        [gb.op("silu", f"{p}.silu", "ebcf->ebcf", [halves[0]]), halves[1]],
    )
    down = gb.op("einsum", f"{p}.down", "ebcf,ehf->ebch", [act, weights[1]], sizes=sizes)
    combined = gb.op("moe_combine", f"{p}.combine", "ebch,bsec->bsh", [down, gate])
    out = gb.op("reshape", f"{p}.tokens2d", "bsh->(bs)h", [combined], sizes=sizes)
    for name in (logits, gate, x3, routed, both, *halves, act, down, combined, out):
        imp.kind[name] = "activation"
    return out
