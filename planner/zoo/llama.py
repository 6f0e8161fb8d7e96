"""LLaMA-family decoders (LLaMA 3) and Mixtral-style mixtures of experts.

Architecture (as the published models train): untied token embedding and LM head, pre-norm RMSNorm,
grouped-query attention (``kv_heads`` key/value heads, each shared by ``heads / kv_heads`` query
heads: dims ``a`` kv heads, ``g`` queries per kv head, ``d`` head dim), rotary position embeddings
(an elementwise product with a data table per position, applied to q and k), causal attention fused
as engines run it (``attention``: scaled_dot_product_attention / FlashAttention, which never stores
the s x s scores; ``attention=explicit`` writes scores, softmax and the second product as separate
operators), a SwiGLU MLP (gate, up and down projections, ``down(silu(gate(x)) * up(x))``), no
biases, a causal LM cross-entropy loss.

Mixture of experts (``experts > 0``, every layer, as Mixtral): a router (``h -> experts``), top-k
gating with a capacity of ``top_k * seq * capacity_factor / experts`` tokens per expert and sequence
(GShard's dispatch and combine: splitting the expert dim ``e`` over a mesh axis is expert
parallelism, whose dispatch and combine the cost model prices as all-to-alls), SwiGLU experts, and
the Switch/GShard load-balancing loss (router probabilities averaged per expert, times the tokens
each expert receives, summed): each layer's balance loss is a scalar output of its own, whose
gradient reaches the router as if it were added to the LM loss; kept inside its layer, it leaves the
residual stream the only tensor between layers, so the decomposition still cuts there.

FLOPs per token (forward, ``N`` the parameters in matmuls): 2 N_active + 4 * layers * seq * hidden
for the attention products (q k^T and the weighted sum, the full s x s matrix as Megatron-LM counts
it); training is three times that. LLaMA-3 8B at seq 8192: 2 x 7.5e9 + 4 x 32 x 8192 x 4096 =
1.93e10 per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import ModelError
from planner.ir.graph import Graph
from planner.ir.ops import GraphBuilder
from planner.zoo.transformers import fused_attention

ATTENTION_FORMS = ("fused", "explicit")


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    seq: int = 8192
    vocab: int = 128256
    experts: int = 0
    top_k: int = 2
    capacity_factor: float = 1.0
    attention: str = "fused"

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "seq", "vocab", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ModelError(
                    f"--model: field {name!r} must be a positive integer, got {value!r}"
                )
        if isinstance(self.experts, bool) or not isinstance(self.experts, int) or self.experts < 0:
            raise ModelError(
                f"--model: field 'experts' must be a non-negative integer, got {self.experts!r}"
            )
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ModelError(
                f"--model: field 'heads' ({self.heads}) must divide hidden ({self.hidden}) and be "
                f"a multiple of 'kv_heads' ({self.kv_heads})"
            )
        if self.experts and self.top_k > self.experts:
            raise ModelError(
                f"--model: field 'top_k' ({self.top_k}) exceeds 'experts' ({self.experts})"
            )
        if not 0 < self.capacity_factor <= 64:
            raise ModelError(
                f"--model: field 'capacity_factor' must be in (0, 64], got {self.capacity_factor!r}"
            )
        if self.attention not in ATTENTION_FORMS:
            raise ModelError(
                f"--model: field 'attention' must be one of {ATTENTION_FORMS}, got "
                f"{self.attention!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _rmsnorm(gb: GraphBuilder, name: str, x: str, hidden: int) -> str:
    return gb.op(
        "rmsnorm", name, "bsh,h->bsh", [x, gb.param(f"{name}.weight", (hidden,))], norm="h"
    )


def _attention(gb: GraphBuilder, p: str, x: str, rope: str, cfg: LlamaConfig) -> str:
    h, a, d = cfg.hidden, cfg.kv_heads, cfg.head_dim
    g = cfg.heads // a
    q = gb.op(
        "linear",
        f"{p}.q_proj",
        "bsh,hagd->bsagd",
        [x, gb.param(f"{p}.q_proj.weight", (h, a, g, d))],
    )
    k = gb.op(
        "linear", f"{p}.k_proj", "bsh,had->bsad", [x, gb.param(f"{p}.k_proj.weight", (h, a, d))]
    )
    v = gb.op(
        "linear", f"{p}.v_proj", "bsh,had->bsad", [x, gb.param(f"{p}.v_proj.weight", (h, a, d))]
    )
    # the gradient of a product with a constant table needs the table only: autograd saves no
    # copy of q or k for it (PyTorch's MulBackward0 saves an operand only when the other requires
    # a gradient; Megatron-LM's fused RoPE and torchtitan's complex product alike)
    q = gb.op("mul", f"{p}.rope_q", "bsagd,sd->bsagd", [q, rope], saved=[False, True])
    k = gb.op("mul", f"{p}.rope_k", "bsad,sd->bsad", [k, rope], saved=[False, True])
    if cfg.attention == "fused":
        ctx = fused_attention(gb, f"{p}.sdpa", "bsagd,btad,btad->bsagd", [q, k, v], causal=1)
    else:
        scores = gb.op("batch_matmul", f"{p}.scores", "bsagd,btad->bagst", [q, k])
        probs = gb.op("softmax", f"{p}.softmax", "bagst->bagst", [scores], norm="t")
        ctx = gb.op("batch_matmul", f"{p}.context", "bagst,btad->bsagd", [probs, v])
    return gb.op(
        "linear",
        f"{p}.o_proj",
        "bsagd,agdh->bsh",
        [ctx, gb.param(f"{p}.o_proj.weight", (a, g, d, h))],
    )


def _swiglu(gb: GraphBuilder, p: str, x: str, lead: str, shapes: tuple[tuple, tuple, str]) -> str:
    """down(silu(gate(x)) * up(x)); ``lead`` the token dims, ``shapes`` the weight shapes and the
    weight's own leading dims (the expert dim for experts)."""
    up_shape, down_shape, own = shapes
    gate = gb.op(
        "einsum" if own else "linear",
        f"{p}.gate_proj",
        f"{lead}h,{own}hf->{lead}f",
        [x, gb.param(f"{p}.gate_proj.weight", up_shape)],
    )
    up = gb.op(
        "einsum" if own else "linear",
        f"{p}.up_proj",
        f"{lead}h,{own}hf->{lead}f",
        [x, gb.param(f"{p}.up_proj.weight", up_shape)],
    )
    # SwiGLU as the engines fuse it: the backward pass recomputes silu(gate) from the gate that
    # silu saves, so the product keeps only the up projection (Megatron-LM's fused bias-SwiGLU,
    # megatron/core/fusions/fused_bias_swiglu.py, on by default, saves its input alone;
    # torch.compile recomputes the pointwise silu in torchtitan's blocks)
    act = gb.op(
        "mul",
        f"{p}.swiglu",
        f"{lead}f,{lead}f->{lead}f",
        [gb.op("silu", f"{p}.silu", f"{lead}f->{lead}f", [gate]), up],
        saved=[False, True],
    )
    return gb.op(
        "einsum" if own else "linear",
        f"{p}.down_proj",
        f"{lead}f,{own}fh->{lead}h",
        [act, gb.param(f"{p}.down_proj.weight", down_shape)],
    )


def _moe(gb: GraphBuilder, p: str, x: str, cfg: LlamaConfig) -> str:
    """Top-k routed SwiGLU experts and the layer's load-balancing loss (a scalar output of its
    own)."""
    h, f, e = cfg.hidden, cfg.ffn, cfg.experts
    capacity = max(1, math.ceil(cfg.top_k * cfg.seq * cfg.capacity_factor / e))
    logits = gb.op(
        "matmul", f"{p}.router", "bsh,he->bse", [x, gb.param(f"{p}.router.weight", (h, e))]
    )
    gate = gb.op("moe_gate", f"{p}.gate", "bse->bsec", [logits], sizes={"c": capacity})
    routed = gb.op("moe_dispatch", f"{p}.dispatch", "bsh,bsec->ebch", [x, gate])
    out = _swiglu(gb, f"{p}.experts", routed, "ebc", ((e, h, f), (e, f, h), "e"))
    combined = gb.op("moe_combine", f"{p}.combine", "ebch,bsec->bsh", [out, gate])
    probs = gb.op("softmax", f"{p}.router_probs", "bse->bse", [logits], norm="e")
    mean_prob = gb.op("reduce", f"{p}.mean_prob", "bse->e", [probs])
    load = gb.op("reduce", f"{p}.tokens_per_expert", "bsec->e", [gate])
    aux = gb.op("mul", f"{p}.balance", "e,e->e", [mean_prob, load])
    gb.op("reduce", f"{p}.aux_loss", "e->", [aux])
    return combined


def llama(cfg: LlamaConfig, batch: int = 8, name: str = "llama") -> Graph:
    """A LLaMA-3-style decoder (or Mixtral-style MoE when ``cfg.experts``) with a causal LM loss."""
    gb = GraphBuilder(name)
    tokens = gb.data("tokens", (batch, cfg.seq), integer=True)
    labels = gb.data("labels", (batch, cfg.seq), integer=True)
    rope = gb.data("rope", (cfg.seq, cfg.head_dim))  # cos/sin table: a function of position only
    x = gb.op(
        "embedding",
        "embed",
        "bs,vh->bsh",
        [tokens, gb.param("embed.weight", (cfg.vocab, cfg.hidden))],
    )
    for i in range(cfg.layers):
        gb.layer = i
        gb.checkpoint(x)
        attn = _attention(
            gb, f"l{i}.attn", _rmsnorm(gb, f"l{i}.attn_norm", x, cfg.hidden), rope, cfg
        )
        x = gb.op("add", f"l{i}.attn_residual", "bsh,bsh->bsh", [x, attn])
        normed = _rmsnorm(gb, f"l{i}.mlp_norm", x, cfg.hidden)
        if cfg.experts:
            mlp = _moe(gb, f"l{i}.moe", normed, cfg)
        else:
            mlp = _swiglu(
                gb, f"l{i}.mlp", normed, "bs", ((cfg.hidden, cfg.ffn), (cfg.ffn, cfg.hidden), "")
            )
        x = gb.op("add", f"l{i}.mlp_residual", "bsh,bsh->bsh", [x, mlp])
    gb.layer = None
    gb.checkpoint(x)
    x = _rmsnorm(gb, "final_norm", x, cfg.hidden)
    logits = gb.op(
        "linear", "lm_head", "bsh,hv->bsv", [x, gb.param("lm_head.weight", (cfg.hidden, cfg.vocab))]
    )
    gb.op("cross_entropy", "loss", "bsv,bs->", [logits, labels], norm="v")
    return gb.build()
