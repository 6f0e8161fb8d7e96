"""Top-k routed mixtures of experts (transformers' Mixtral block) mapped onto GShard's operators.

transformers routes with ``topk`` over the router probabilities, then sorts the (token, expert) pairs,
gathers the tokens, runs one grouped matmul per projection and scatters the results back (data-
dependent shapes that no einsum states). The handler for ``topk`` takes that whole region, from
``topk`` to the sum over the k picks that returns one row per token, and writes instead what it
computes in GShard's terms: a capacity gate over the probabilities, the dispatch to the experts, the
experts' SwiGLU (gate/up projection, split, SiLU, product, down projection) on the grouped weights, and
the combine. The capacity is k x tokens / experts (no token dropped on average), as the zoo's MoE.
"""

from __future__ import annotations

import math

from planner.engines.torch_import.handlers import register
from planner.engines.torch_import.state import ImportState


def _region(topk) -> tuple[set[str], object | None]:
    """Names of the nodes computed from ``topk`` up to the per-token sum, and that sum node."""
    seen, frontier, end = set(), [topk], None
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if user.name in seen:
                continue
            seen.add(user.name)
            if "sum" in str(user.target) and len(getattr(user.meta.get("val"), "shape", ())) == 2:
                end = user
                continue
            frontier.append(user)
    return seen, end


def _grouped(region: set[str], topk) -> list:
    graph_nodes = list(topk.graph.nodes)
    return [n for n in graph_nodes if n.name in region and "grouped_mm" in str(n.target)]


@register("topk")
def _topk(imp: ImportState, node, op: str) -> None:
    region, end = _region(node)
    matmuls = _grouped(region, node)
    tokens_src = next((n for n in node.graph.nodes if n.name in region and str(n.target) == "aten.index.Tensor"
                       and imp.tensor(n.args[0]) is not None), None)
    if end is None or len(matmuls) != 2 or tokens_src is None:
        return imp.unknown(node, [imp.tensor(node.args[0])])
    probs, x2d = imp.tensor(node.args[0]), imp.tensor(tokens_src.args[0])
    weights = [imp.tensor(m.args[1].args[0]) for m in matmuls]  # grouped_mm(x, transpose(param), offsets)
    if None in weights or len(imp.gb.shape(probs)) != 2:
        return imp.unknown(node, [probs])
    tokens, experts = imp.gb.shape(probs)
    hidden = imp.gb.shape(x2d)[1]
    _, double, _ = imp.gb.shape(weights[0])  # [e, 2 f, h]
    k = node.args[1]
    capacity = max(1, math.ceil(k * tokens / experts))
    gb, p = imp.gb, node.name
    sizes = {"x": 1, "t": tokens, "e": experts, "h": hidden, "c": capacity, "g": double, "f": double // 2, "p": 2}
    logits = gb.op("reshape", f"{p}.probs3d", "(xt)e->xte", [probs], sizes=sizes)
    gate = gb.op("moe_gate", f"{p}.gate", "xte->xtec", [logits], sizes=sizes)
    x3 = gb.op("reshape", f"{p}.tokens3d", "(xt)h->xth", [x2d], sizes=sizes)
    routed = gb.op("moe_dispatch", f"{p}.dispatch", "xth,xtec->exch", [x3, gate])
    both = gb.op("einsum", f"{p}.gate_up", "exch,egh->excg", [routed, weights[0]], sizes=sizes)
    halves = [f"{p}.gate_half", f"{p}.up_half"]
    gb.op("split", f"{p}.chunk", "exc(pf)->excf,excf", [both], sizes=sizes, out=halves, unsplittable="p")
    act = gb.op("mul", f"{p}.swiglu", "excf,excf->excf", [gb.op("silu", f"{p}.silu", "excf->excf", [halves[0]]),
                                                          halves[1]])
    down = gb.op("einsum", f"{p}.down", "excf,ehf->exch", [act, weights[1]], sizes=sizes)
    combined = gb.op("moe_combine", f"{p}.combine", "exch,xtec->xth", [down, gate])
    out = gb.op("reshape", f"{p}.tokens2d", "xth->(xt)h", [combined], sizes=sizes)
    for name in (logits, gate, x3, routed, both, *halves, act, down, combined, out):
        imp.kind[name] = "activation"
    imp.skip |= region - {end.name}
    imp.skip.add(end.name)
    imp.value[end.name] = out
