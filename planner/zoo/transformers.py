"""Transformer models of the zoo: GPT (and its MoE form), BERT, an MLP and a single block.

Conventions (documented choices, see README):
- Transformers write attention weights per head (``q: [h, heads, head_dim]``), so splitting the
  head dim of the QKV projections is a contiguous column split, exactly Megatron's layout. Dropout
  is omitted unless ``dropout=1`` (Megatron-LM's three dropouts per layer: attention probabilities,
  attention output, MLP output; each keeps a 1-byte mask); the language-model head is tied to the
  token embedding.
- GPT-2 vocabularies are padded to 50304 (as Megatron-LM and nanoGPT do) so they divide by 8;
  GPT-3 sizes use Megatron's padded 51200. BERT keeps 30522.
- Default global batch: 8 sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import ModelError
from planner.ir.graph import Graph
from planner.ir.ops import GraphBuilder

LM_BATCH = 8


@dataclass(frozen=True, slots=True)
class GPTConfig:
    layers: int
    hidden: int
    heads: int
    seq: int = 1024
    vocab: int = 50304
    ffn: int = 0  # 0: 4 * hidden
    experts: int = 0  # >0: every other layer's MLP is a mixture of experts (GShard, top-2)
    capacity_factor: float = 1.0
    dropout: int = 0  # 1: Megatron's dropouts (attention probabilities, attention and MLP outputs)
    # explicit: scores, softmax and context as three operators (what a plain PyTorch layer saves);
    # fused: one attention kernel that keeps its inputs and output only (FlashAttention,
    # Megatron-LM's --attention-backend flash/fused/auto; its dropout mask is regenerated, not kept)
    attention: str = "explicit"

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ModelError(
                    f"--model: field {name!r} must be a positive integer, got {value!r}"
                )
        if self.dropout not in (0, 1):
            raise ModelError(f"--model: field 'dropout' must be 0 or 1, got {self.dropout!r}")
        if self.attention not in ("fused", "explicit"):
            raise ModelError(
                f"--model: field 'attention' must be fused or explicit, got {self.attention!r}"
            )
        for name in ("ffn", "experts"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ModelError(
                    f"--model: field {name!r} must be a non-negative integer, got {value!r}"
                )
        if (
            not isinstance(self.capacity_factor, (int, float))
            or not 0 < self.capacity_factor <= 64
            or self.capacity_factor != self.capacity_factor
        ):
            raise ModelError(
                "--model: field 'capacity_factor' must be a finite number in (0, 64], got "
                f"{self.capacity_factor!r}"
            )
        if self.hidden % self.heads:
            raise ModelError(
                f"--model: field 'heads' ({self.heads}) must divide hidden ({self.hidden})"
            )


def _layernorm(gb: GraphBuilder, name: str, x: str, hidden: int) -> str:
    gamma = gb.param(f"{name}.weight", (hidden,))
    beta = gb.param(f"{name}.bias", (hidden,))
    return gb.op("layernorm", name, "bsh,h,h->bsh", [x, gamma, beta], norm="h")


def _linear(
    gb: GraphBuilder,
    name: str,
    x: str,
    equation: str,
    weight_shape: tuple[int, ...],
    bias_shape: tuple[int, ...] | None,
) -> str:
    inputs = [x, gb.param(f"{name}.weight", weight_shape)]
    if bias_shape is not None:
        inputs.append(gb.param(f"{name}.bias", bias_shape))
    return gb.op("linear", name, equation, inputs)


def _attention(gb: GraphBuilder, p: str, x: str, cfg: GPTConfig, causal: int = 0) -> str:
    h, a = cfg.hidden, cfg.heads
    d = h // a
    q, k, v = (_linear(gb, f"{p}.{n}", x, "bsh,had,ad->bsad", (h, a, d), (a, d)) for n in "qkv")
    if cfg.attention == "fused":
        ctx = fused_attention(gb, f"{p}.sdpa", "bsad,btad,btad->bsad", [q, k, v], causal)
    else:
        ctx = _explicit_attention(gb, p, q, k, v, cfg)
    return _dropout(
        gb,
        f"{p}.out_dropout",
        _linear(gb, f"{p}.proj", ctx, "bsad,adh,h->bsh", (a, d, h), (h,)),
        cfg,
    )


def fused_attention(gb: GraphBuilder, name: str, equation: str, qkv: list, causal: int) -> str:
    """One attention kernel (FlashAttention, PyTorch's scaled_dot_product_attention): keys and
    values are read whole by every query position (``t`` and ``d`` unsplittable)."""
    return gb.op("attention", name, equation, qkv, unsplittable="td", attrs={"causal": causal})


def _explicit_attention(gb: GraphBuilder, p: str, q: str, k: str, v: str, cfg: GPTConfig) -> str:
    scores = gb.op("batch_matmul", f"{p}.scores", "bsad,btad->bast", [q, k])
    probs = gb.op("softmax", f"{p}.softmax", "bast->bast", [scores], norm="t")
    if cfg.dropout:
        probs = gb.op("dropout", f"{p}.dropout", "bast->bast", [probs])
    return gb.op("batch_matmul", f"{p}.context", "bast,btad->bsad", [probs, v])


def _dropout(gb: GraphBuilder, name: str, x: str, cfg: GPTConfig) -> str:
    return gb.op("dropout", name, "bsh->bsh", [x]) if cfg.dropout else x


def _mlp(gb: GraphBuilder, p: str, x: str, cfg: GPTConfig) -> str:
    h, f = cfg.hidden, cfg.ffn or 4 * cfg.hidden
    up = _linear(gb, f"{p}.fc1", x, "bsh,hf,f->bsf", (h, f), (f,))
    act = gb.op("gelu", f"{p}.gelu", "bsf->bsf", [up])
    return _dropout(
        gb, f"{p}.out_dropout", _linear(gb, f"{p}.fc2", act, "bsf,fh,h->bsh", (f, h), (h,)), cfg
    )


def _moe(gb: GraphBuilder, p: str, x: str, cfg: GPTConfig) -> str:
    """GShard MoE: router, top-2 gating with capacity, dispatch (all-to-all), experts, combine."""
    h, f, e = cfg.hidden, cfg.ffn or 4 * cfg.hidden, cfg.experts
    capacity = max(1, int(round(2 * cfg.seq * cfg.capacity_factor / e)))
    logits = gb.op(
        "matmul", f"{p}.router", "bsh,he->bse", [x, gb.param(f"{p}.router.weight", (h, e))]
    )
    gate = gb.op("moe_gate", f"{p}.gate", "bse->bsec", [logits], sizes={"c": capacity})
    routed = gb.op("moe_dispatch", f"{p}.dispatch", "bsh,bsec->ebch", [x, gate])
    up = gb.op(
        "einsum",
        f"{p}.expert_fc1",
        "ebch,ehf,ef->ebcf",
        [
            routed,
            gb.param(f"{p}.expert_fc1.weight", (e, h, f)),
            gb.param(f"{p}.expert_fc1.bias", (e, f)),
        ],
    )
    act = gb.op("gelu", f"{p}.gelu", "ebcf->ebcf", [up])
    down = gb.op(
        "einsum",
        f"{p}.expert_fc2",
        "ebcf,efh,eh->ebch",
        [
            act,
            gb.param(f"{p}.expert_fc2.weight", (e, f, h)),
            gb.param(f"{p}.expert_fc2.bias", (e, h)),
        ],
    )
    return gb.op("moe_combine", f"{p}.combine", "ebch,bsec->bsh", [down, gate])


def gpt(cfg: GPTConfig, batch: int = LM_BATCH, name: str = "gpt") -> Graph:
    """A GPT (pre-LN decoder) with learned positions and a tied LM head."""
    gb = GraphBuilder(name)
    tokens = gb.data("tokens", (batch, cfg.seq), integer=True)
    labels = gb.data("labels", (batch, cfg.seq), integer=True)
    wte = gb.param("wte", (cfg.vocab, cfg.hidden))
    x = gb.op("embedding", "embed", "bs,vh->bsh", [tokens, wte])
    x = gb.op("add", "pos_embed", "bsh,sh->bsh", [x, gb.param("wpe", (cfg.seq, cfg.hidden))])
    for i in range(cfg.layers):
        gb.layer = i
        gb.checkpoint(x)
        x = gb.op(
            "add",
            f"h{i}.attn_residual",
            "bsh,bsh->bsh",
            [
                x,
                _attention(
                    gb, f"h{i}.attn", _layernorm(gb, f"h{i}.ln1", x, cfg.hidden), cfg, causal=1
                ),
            ],
        )
        block = _moe if cfg.experts and i % 2 == 1 else _mlp
        x = gb.op(
            "add",
            f"h{i}.mlp_residual",
            "bsh,bsh->bsh",
            [x, block(gb, f"h{i}.mlp", _layernorm(gb, f"h{i}.ln2", x, cfg.hidden), cfg)],
        )
    gb.layer = None
    gb.checkpoint(x)
    x = _layernorm(gb, "ln_f", x, cfg.hidden)
    logits = gb.op("linear", "lm_head", "bsh,vh->bsv", [x, wte])
    gb.op("cross_entropy", "loss", "bsv,bs->", [logits, labels], norm="v")
    return gb.build()


def bert(
    layers: int,
    hidden: int,
    heads: int,
    batch: int = LM_BATCH,
    seq: int = 512,
    vocab: int = 30522,
    name: str = "bert",
) -> Graph:
    """BERT (post-LN encoder) with token-type embeddings and the tied masked-LM head."""
    cfg = GPTConfig(layers, hidden, heads, seq, vocab)
    gb = GraphBuilder(name)
    tokens = gb.data("tokens", (batch, seq), integer=True)
    types = gb.data("token_types", (batch, seq), integer=True)
    labels = gb.data("labels", (batch, seq), integer=True)
    wte = gb.param("word_embeddings", (vocab, hidden))
    x = gb.op("embedding", "embed", "bs,vh->bsh", [tokens, wte])
    # The position table has one row per position used (512 rows at the published seq 512).
    x = gb.op(
        "add", "pos_embed", "bsh,sh->bsh", [x, gb.param("position_embeddings", (seq, hidden))]
    )
    t = gb.op(
        "embedding",
        "type_embed",
        "bs,vh->bsh",
        [types, gb.param("token_type_embeddings", (2, hidden))],
    )
    x = _layernorm(gb, "embed_ln", gb.op("add", "type_add", "bsh,bsh->bsh", [x, t]), hidden)
    for i in range(layers):
        gb.layer = i
        gb.checkpoint(x)
        x = _post_ln_block(gb, f"l{i}", x, cfg)
    gb.layer = None
    gb.checkpoint(x)
    y = _linear(gb, "mlm.dense", x, "bsh,hk,k->bsk", (hidden, hidden), (hidden,))
    y = _layernorm(gb, "mlm.ln", gb.op("gelu", "mlm.gelu", "bsh->bsh", [y]), hidden)
    logits = gb.op(
        "linear", "mlm.decoder", "bsh,vh,v->bsv", [y, wte, gb.param("mlm.decoder.bias", (vocab,))]
    )
    gb.op("cross_entropy", "loss", "bsv,bs->", [logits, labels], norm="v")
    return gb.build()


def _post_ln_block(gb: GraphBuilder, p: str, x, cfg: GPTConfig):
    """A post-LN encoder layer: attention, residual, LayerNorm; MLP, residual, LayerNorm."""
    attn = _attention(gb, f"{p}.attn", x, cfg)
    x = _layernorm(
        gb, f"{p}.ln1", gb.op("add", f"{p}.attn_residual", "bsh,bsh->bsh", [x, attn]), cfg.hidden
    )
    mlp = _mlp(gb, f"{p}.mlp", x, cfg)
    return _layernorm(
        gb, f"{p}.ln2", gb.op("add", f"{p}.mlp_residual", "bsh,bsh->bsh", [x, mlp]), cfg.hidden
    )


def mlp(batch: int = 4096, hidden: int = 256, ffn: int = 0, name: str = "mlp") -> Graph:
    """A residual 2-layer MLP block: layer norm, hidden -> ffn -> hidden with GELU, residual add,
    sum loss.

    The input goes through a layer norm with its own scale and shift so that, as inside a network,
    the linear layers read an activation whose gradient is needed.
    """
    ffn = ffn or 4 * hidden
    gb = GraphBuilder(name)
    x = gb.data("x", (batch, hidden))
    normed = gb.op(
        "layernorm",
        "ln",
        "bh,h,h->bh",
        [x, gb.param("ln.weight", (hidden,)), gb.param("ln.bias", (hidden,))],
        norm="h",
    )
    y = gb.op("linear", "fc1", "bh,hf->bf", [normed, gb.param("fc1.weight", (hidden, ffn))])
    y = gb.op("gelu", "gelu", "bf->bf", [y])
    y = gb.op("linear", "fc2", "bf,fh->bh", [y, gb.param("fc2.weight", (ffn, hidden))])
    y = gb.op("add", "residual", "bh,bh->bh", [normed, y])
    gb.op("reduce", "loss", "bh->", [y])
    return gb.build()


def transformer_block(
    batch: int = LM_BATCH,
    seq: int = 1024,
    hidden: int = 1024,
    heads: int = 16,
    name: str = "transformer-block",
) -> Graph:
    """One pre-LN GPT block on a data input, with a sum loss."""
    cfg = GPTConfig(1, hidden, heads, seq)
    gb = GraphBuilder(name)
    x = gb.data("x", (batch, seq, hidden))
    x = gb.op(
        "add",
        "attn_residual",
        "bsh,bsh->bsh",
        [x, _attention(gb, "attn", _layernorm(gb, "ln1", x, hidden), cfg)],
    )
    x = gb.op(
        "add",
        "mlp_residual",
        "bsh,bsh->bsh",
        [x, _mlp(gb, "mlp", _layernorm(gb, "ln2", x, hidden), cfg)],
    )
    gb.op("reduce", "loss", "bsh->", [x])
    return gb.build()
