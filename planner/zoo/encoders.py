"""Vision Transformer (ViT) and the T5 encoder-decoder.

ViT (Dosovitskiy et al.; ViT-H/14: 32 layers, hidden 1280, 16 heads, MLP 5120, 14 x 14 patches of a
224 x 224 image, 632M parameters with a 1000-class head): a patch convolution, a class token
concatenated before the 256 patch tokens, learned positions, pre-LN blocks with biased projections,
fused (non-causal) attention, GELU MLP, a final LayerNorm and a linear head on the class token.

T5 (Raffel et al.; T5-3B: 24 + 24 layers, d_model 1024, 32 heads of 128, FFN 16384 with ReLU, vocab
32128, 2.85B parameters): one embedding shared by encoder, decoder and LM head, scale-only RMS
norms, no biases, relative position biases (a learned table of 32 buckets per head, looked up once
per stack and added to every layer's scores), fused attention (causal in the decoder's
self-attention), cross-attention of every decoder layer over the encoder output, and a cross-entropy
loss.

FLOPs per token (forward): 2 x the matmul parameters it passes through plus 4 x layers x seq x
hidden for attention; for T5, decoder tokens also pay cross-attention (4 x layers x seq_enc x
inner).
"""

from __future__ import annotations

from planner.ir.graph import Graph
from planner.ir.ops import GraphBuilder

BUCKETS = 32


def _layernorm(gb: GraphBuilder, name: str, x: str, hidden: int) -> str:
    return gb.op(
        "layernorm",
        name,
        "bsh,h,h->bsh",
        [x, gb.param(f"{name}.weight", (hidden,)), gb.param(f"{name}.bias", (hidden,))],
        norm="h",
    )


def _vit_block(gb: GraphBuilder, p: str, x: str, hidden: int, heads: int, mlp: int) -> str:
    d = hidden // heads
    y = _layernorm(gb, f"{p}.ln1", x, hidden)
    q, k, v = (
        gb.op(
            "linear",
            f"{p}.{n}",
            "bsh,had,ad->bsad",
            [
                y,
                gb.param(f"{p}.{n}.weight", (hidden, heads, d)),
                gb.param(f"{p}.{n}.bias", (heads, d)),
            ],
        )
        for n in ("query", "key", "value")
    )
    ctx = gb.op("attention", f"{p}.sdpa", "bsad,btad,btad->bsad", [q, k, v], unsplittable="td")
    out = gb.op(
        "linear",
        f"{p}.proj",
        "bsad,adh,h->bsh",
        [
            ctx,
            gb.param(f"{p}.proj.weight", (heads, d, hidden)),
            gb.param(f"{p}.proj.bias", (hidden,)),
        ],
    )
    x = gb.op("add", f"{p}.attn_residual", "bsh,bsh->bsh", [x, out])
    y = _layernorm(gb, f"{p}.ln2", x, hidden)
    y = gb.op(
        "linear",
        f"{p}.fc1",
        "bsh,hf,f->bsf",
        [y, gb.param(f"{p}.fc1.weight", (hidden, mlp)), gb.param(f"{p}.fc1.bias", (mlp,))],
    )
    y = gb.op(
        "linear",
        f"{p}.fc2",
        "bsf,fh,h->bsh",
        [
            gb.op("gelu", f"{p}.gelu", "bsf->bsf", [y]),
            gb.param(f"{p}.fc2.weight", (mlp, hidden)),
            gb.param(f"{p}.fc2.bias", (hidden,)),
        ],
    )
    return gb.op("add", f"{p}.mlp_residual", "bsh,bsh->bsh", [x, y])


def vit(
    layers: int = 32,
    hidden: int = 1280,
    heads: int = 16,
    mlp: int = 5120,
    patch: int = 14,
    image: int = 224,
    classes: int = 1000,
    batch: int = 64,
    name: str = "vit-h14",
) -> Graph:
    """A ViT classifier (defaults: ViT-H/14)."""
    grid = image // patch
    gb = GraphBuilder(name)
    images = gb.data("images", (batch, 3, image, image))
    labels = gb.data("labels", (batch,), integer=True)
    x = _vit_embed(gb, images, hidden, patch, grid)
    for i in range(layers):
        gb.layer = i
        gb.checkpoint(x)
        x = _vit_block(gb, f"l{i}", x, hidden, heads, mlp)
    gb.layer = None
    gb.checkpoint(x)
    x = _layernorm(gb, "ln_f", x, hidden)
    cls = gb.op(
        "slice",
        "cls_select",
        "b(sk)h->bkh",
        [x],
        sizes={"s": grid * grid + 1, "k": 1},
        unsplittable="sk",
        attrs={"index": 0},
    )
    logits = gb.op(
        "linear",
        "head",
        "bkh,hc,c->bc",
        [cls, gb.param("head.weight", (hidden, classes)), gb.param("head.bias", (classes,))],
    )
    gb.op("cross_entropy", "loss", "bc,b->", [logits, labels], norm="c")
    return gb.build()


def _vit_embed(gb: GraphBuilder, images, hidden: int, patch: int, grid: int):
    """Patches embedded by a strided convolution, the class token prepended, positions added."""
    patches = gb.op(
        "conv2d",
        "patch_embed",
        "bcHW,ocrt,o->bopq",
        [
            images,
            gb.param("patch_embed.weight", (hidden, 3, patch, patch)),
            gb.param("patch_embed.bias", (hidden,)),
        ],
        sizes={"o": hidden, "r": patch, "t": patch, "p": grid, "q": grid},
        attrs={"stride": patch, "padding": 0},
    )
    tokens = gb.op("reshape", "patch_flatten", "bopq->bo(pq)", [patches])
    tokens = gb.op("transpose", "patch_tokens", "bon->bno", [tokens])
    x = gb.op(
        "concat",
        "cls_concat",
        "bnh,kh->bsh",
        [tokens, gb.param("cls_token", (1, hidden))],
        sizes={"s": grid * grid + 1},
        unsplittable="nks",
    )
    x = gb.op(
        "add", "pos_add", "bsh,sh->bsh", [x, gb.param("pos_embed", (grid * grid + 1, hidden))]
    )
    return x


def _t5_norm(gb: GraphBuilder, name: str, x: str, hidden: int) -> str:
    return gb.op(
        "rmsnorm", name, "bsh,h->bsh", [x, gb.param(f"{name}.weight", (hidden,))], norm="h"
    )


def _t5_attention(
    gb: GraphBuilder,
    p: str,
    x: str,
    kv: str,
    bias: str | None,
    dims: tuple[int, int, int],
    causal: int,
) -> str:
    hidden, heads, d = dims
    q = gb.op(
        "linear", f"{p}.q", "bsh,had->bsad", [x, gb.param(f"{p}.q.weight", (hidden, heads, d))]
    )
    k = gb.op(
        "linear", f"{p}.k", "bsh,had->bsad", [kv, gb.param(f"{p}.k.weight", (hidden, heads, d))]
    )
    v = gb.op(
        "linear", f"{p}.v", "bsh,had->bsad", [kv, gb.param(f"{p}.v.weight", (hidden, heads, d))]
    )
    inputs, equation = [q, k, v], "bsad,btad,btad->bsad"
    if bias is not None:
        inputs, equation = inputs + [bias], "bsad,btad,btad,sta->bsad"
    ctx = gb.op(
        "attention", f"{p}.sdpa", equation, inputs, unsplittable="td", attrs={"causal": causal}
    )
    return gb.op(
        "linear", f"{p}.o", "bsad,adh->bsh", [ctx, gb.param(f"{p}.o.weight", (heads, d, hidden))]
    )


def _t5_ffn(gb: GraphBuilder, p: str, x: str, hidden: int, ffn: int) -> str:
    y = gb.op("linear", f"{p}.wi", "bsh,hf->bsf", [x, gb.param(f"{p}.wi.weight", (hidden, ffn))])
    return gb.op(
        "linear",
        f"{p}.wo",
        "bsf,fh->bsh",
        [gb.op("relu", f"{p}.relu", "bsf->bsf", [y]), gb.param(f"{p}.wo.weight", (ffn, hidden))],
    )


def _position_bias(gb: GraphBuilder, name: str, buckets: str, table: str) -> str:
    return gb.op("embedding", name, "st,ra->sta", [buckets, table])


def t5(
    layers: int = 24,
    hidden: int = 1024,
    heads: int = 32,
    head_dim: int = 128,
    ffn: int = 16384,
    vocab: int = 32128,
    seq: int = 512,
    batch: int = 8,
    name: str = "t5-3b",
) -> Graph:
    """A T5 encoder-decoder (defaults: T5-3B) with ``seq`` input and target tokens."""
    dims = (hidden, heads, head_dim)
    gb = GraphBuilder(name)
    shared = gb.param("shared_embedding", (vocab, hidden))  # encoder, decoder and LM head
    inputs = gb.data("input_ids", (batch, seq), integer=True)
    targets = gb.data("decoder_input_ids", (batch, seq), integer=True)
    labels = gb.data("labels", (batch, seq), integer=True)
    x = gb.op("embedding", "encoder.embed", "bs,vh->bsh", [inputs, shared])
    # bucket ids are a function of (query, key) positions; each layer looks its bias up in the
    # stack's one table (T5 computes it once and passes it on: the same values, and the layers
    # stay a chain)
    buckets = gb.data("position_buckets", (seq, seq), integer=True)
    causal_buckets = gb.data("causal_position_buckets", (seq, seq), integer=True)
    tables = {
        stack: gb.param(f"{stack}.relative_attention_bias", (BUCKETS, heads))
        for stack in ("encoder", "decoder")
    }
    for i in range(layers):
        gb.layer = i
        gb.checkpoint(x)
        x = _t5_encoder_layer(gb, f"encoder.{i}", x, dims, ffn, buckets, tables["encoder"])
    encoded = _t5_norm(gb, "encoder.final_norm", x, hidden)
    y = gb.op("embedding", "decoder.embed", "bs,vh->bsh", [targets, shared])
    for i in range(layers):
        gb.layer = layers + i
        gb.checkpoint(y)
        y = _t5_decoder_layer(
            gb, f"decoder.{i}", y, encoded, dims, ffn, causal_buckets, tables["decoder"]
        )
    gb.layer = None
    y = _t5_norm(gb, "decoder.final_norm", y, hidden)
    logits = gb.op("linear", "lm_head", "bsh,vh->bsv", [y, shared])
    gb.op("cross_entropy", "loss", "bsv,bs->", [logits, labels], norm="v")
    return gb.build()


def _t5_encoder_layer(gb: GraphBuilder, p: str, x, dims, ffn: int, buckets, table):
    """Self-attention with the stack's position bias, then the feed-forward block."""
    hidden = dims[0]
    normed = _t5_norm(gb, f"{p}.ln1", x, hidden)
    bias = _position_bias(gb, f"{p}.position_bias", buckets, table)
    attn = _t5_attention(gb, f"{p}.attn", normed, normed, bias, dims, 0)
    x = gb.op("add", f"{p}.attn_residual", "bsh,bsh->bsh", [x, attn])
    ffn_out = _t5_ffn(gb, f"{p}.ffn", _t5_norm(gb, f"{p}.ln2", x, hidden), hidden, ffn)
    return gb.op("add", f"{p}.ffn_residual", "bsh,bsh->bsh", [x, ffn_out])


def _t5_decoder_layer(gb: GraphBuilder, p: str, y, encoded, dims, ffn: int, buckets, table):
    """Causal self-attention, cross-attention on the encoder's output, then the feed-forward."""
    hidden = dims[0]
    normed = _t5_norm(gb, f"{p}.ln1", y, hidden)
    bias = _position_bias(gb, f"{p}.position_bias", buckets, table)
    attn = _t5_attention(gb, f"{p}.self", normed, normed, bias, dims, 1)
    y = gb.op("add", f"{p}.self_residual", "bsh,bsh->bsh", [y, attn])
    normed = _t5_norm(gb, f"{p}.ln2", y, hidden)
    cross = _t5_attention(gb, f"{p}.cross", normed, encoded, None, dims, 0)
    y = gb.op("add", f"{p}.cross_residual", "bsh,bsh->bsh", [y, cross])
    ffn_out = _t5_ffn(gb, f"{p}.ffn", _t5_norm(gb, f"{p}.ln3", y, hidden), hidden, ffn)
    return gb.op("add", f"{p}.ffn_residual", "bsh,bsh->bsh", [y, ffn_out])
