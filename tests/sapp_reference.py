"""MindSpore's SAPP reference graphs rebuilt in the planner's IR, and the strategies it chose.

tests/data/sapp/*.json hold what MindSpore 2.10 (``search_mode="recursive_programming"``, training
graph, full batch, dry run) chose for an MLP and for one and twelve pre-LN transformer blocks (see
tests/data/sapp/README.md). The builders below write the same graphs, operator for operator, with
MindSpore's instance names (``l{layer}.`` prefixed in the block stacks): MatMuls as ``linear``,
elementwise operators as they are, reshapes and transposes as views.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from planner.ir.graph import Graph
from planner.ir.ops import GraphBuilder

DATA = Path(__file__).parent / "data" / "sapp"


def load(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def mlp(rows: int, hidden: int) -> Graph:
    gb = GraphBuilder("sapp_mlp", batch_dim="r")
    x = gb.data("x", (rows, hidden))
    y = gb.op("linear", "mm1", "rh,hn->rn", [x, gb.param("w1", (hidden, hidden))])
    y = gb.op("relu", "relu", "rn->rn", [y])
    y = gb.op("linear", "mm2", "rn,nh->rh", [y, gb.param("w2", (hidden, hidden))])
    gb.op("reduce", "mean", "rh->", [gb.op("unary", "sq", "rh->rh", [y])])
    return gb.build()


def _block(
    gb: GraphBuilder, i: int, x: str, bs: int, seq: int, hidden: int, heads: int, ffn: int
) -> str:
    p = f"l{i}."
    gb.layer = i
    x = _attention(gb, p, x, bs, seq, hidden, heads)
    up = gb.op(
        "linear",
        p + "mm_1",
        "rh,hf->rf",
        [_norm(gb, p, hidden, "ln2", x), gb.param(p + "w1", (hidden, ffn))],
    )
    down = gb.op(
        "linear",
        p + "mm_2",
        "rf,fh->rh",
        [gb.op("gelu", p + "gelu", "rf->rf", [up]), gb.param(p + "w2", (ffn, hidden))],
    )
    return gb.op("add", p + "add2", "rh,rh->rh", [x, down])


def _norm(gb: GraphBuilder, p: str, hidden: int, name: str, t: str) -> str:
    gamma, beta = gb.param(p + name + ".g", (hidden,)), gb.param(p + name + ".b", (hidden,))
    return gb.op("layernorm", p + name, "rh,h,h->rh", [t, gamma, beta], norm="h")


def _attention(gb: GraphBuilder, p: str, x: str, bs: int, seq: int, hidden: int, heads: int):
    """SAPP's attention: fused qkv, split, heads, scores, softmax, context, projection, residual."""
    head_dim = hidden // heads

    def head(name: str, t: str, seq_dim: str) -> str:
        t = gb.op(
            "reshape",
            p + "reshape_" + name,
            f"({'b' + seq_dim})(ad)->b{seq_dim}ad",
            [t],
            sizes={"b": bs, seq_dim: seq, "a": heads, "d": head_dim},
        )
        return gb.op("transpose", p + "tr_" + name, f"b{seq_dim}ad->ba{seq_dim}d", [t])

    qkv = gb.op(
        "linear",
        p + "mm_qkv",
        "rh,hn->rn",
        [_norm(gb, p, hidden, "ln1", x), gb.param(p + "wqkv", (hidden, 3 * hidden))],
    )
    q, k, v = (f"{p}split.{j}" for j in range(3))
    gb.op(
        "split",
        p + "split",
        "r(cm)->rm,rm,rm",
        [qkv],
        sizes={"c": 3, "m": hidden},
        out=[q, k, v],
        unsplittable="c",
    )
    scores = gb.op(
        "batch_matmul", p + "bmm_qk", "basd,batd->bast", [head("q", q, "s"), head("k", k, "t")]
    )
    probs = gb.op(
        "softmax",
        p + "softmax",
        "bast->bast",
        [gb.op("unary", p + "mul", "bast->bast", [scores])],
        norm="t",
    )
    ctx = gb.op("batch_matmul", p + "bmm_av", "bast,batd->basd", [probs, head("v", v, "t")])
    ctx = gb.op("transpose", p + "tr_o", "basd->bsad", [ctx])
    ctx = gb.op("reshape", p + "reshape_o", "bsad->(bs)(ad)", [ctx])
    return gb.op(
        "add",
        p + "add1",
        "rh,rh->rh",
        [x, gb.op("linear", p + "mm_o", "rh,hn->rn", [ctx, gb.param(p + "wo", (hidden, hidden))])],
    )


def blocks(layers: int, tokens: int, seq: int, hidden: int, heads: int, ffn: int) -> Graph:
    gb = GraphBuilder(f"sapp_tf{layers}", batch_dim="r")
    x = gb.data("x", (tokens, hidden))
    for i in range(layers):
        x = _block(gb, i, x, tokens // seq, seq, hidden, heads, ffn)
    gb.layer = None
    gb.op("reduce", "mean", "rh->", [gb.op("unary", "sq", "rh->rh", [x])])
    return gb.build()


def graph_for(reference: dict) -> Graph:
    shapes = reference["shapes"]
    if reference["model"] == "mlp":
        return mlp(shapes["rows"], shapes["hidden"])
    return blocks(
        shapes["layers"],
        shapes["tokens"],
        shapes["seq"],
        shapes["hidden"],
        shapes["heads"],
        shapes["ffn"],
    )


def op_name(entry: dict) -> str:
    return entry["name"] if entry["layer"] is None else f"l{entry['layer']}.{entry['name']}"


def splits(
    graph: Graph, name: str, strategy: dict[str, str | None], axis_sizes: dict[str, int]
) -> list[list[int]]:
    """Number of pieces per dimension of each input of an operator under a per-axis strategy."""
    op = graph.operator(name)
    out = []
    for operand in op.inputs:
        out.append(
            [
                math.prod(axis_sizes[a] for a, d in strategy.items() if d is not None and d in g)
                for g in operand.dims
            ]
        )
    return out
