"""The LLaMA family, Mixtral-style MoE, fused attention and expert parallelism."""

from __future__ import annotations

import itertools
import math

import pytest

from planner import make_cluster, make_problem, plan
from planner.errors import ModelError
from planner.ir.ops import GraphBuilder
from planner.plans import strategies_from_choice
from planner.search.brute import brute_force
from planner.search.solver import solve
from planner.zoo import load_model

PUBLISHED = {
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
    "llama3-405b": 405.9e9,
    "mixtral-8x7b": 46.7e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_ones(name):
    assert abs(load_model(name).num_params / PUBLISHED[name] - 1) < 0.005


def test_llama3_8b_by_hand():
    """Per layer: q and o 4096^2, k and v 4096 x 1024, SwiGLU 3 x 4096 x 14336, two norms; untied
    embedding and head 128256 x 4096 each; FLOPs per token 2 x 6.98e9 (layers) + 2 x 0.525e9 (head)
    + 4 x 32 x 8192 x 4096 (attention products)."""
    graph = load_model("llama3-8b", batch=1)
    layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert graph.num_params == 32 * layer + 2 * 128256 * 4096 + 4096
    matmul_params = 32 * (layer - 2 * 4096) + 128256 * 4096  # the embedding is a lookup
    per_token = 2 * matmul_params + 4 * 32 * 8192 * 4096
    core = sum(op.flops for op in graph.operators if op.kind in ("linear", "attention"))
    assert core == per_token * 8192


def test_grouped_query_attention_shares_kv_heads():
    graph = load_model("llama:layers=1,hidden=256,heads=8,kv_heads=2,ffn=512,seq=64,vocab=512")
    assert graph.tensor("l0.attn.k_proj.weight").shape == (256, 2, 32)
    assert graph.tensor("l0.attn.q_proj.weight").shape == (256, 2, 4, 32)
    sdpa = graph.operator("l0.attn.sdpa")
    assert (
        sdpa.kind == "attention" and {"t", "d"} <= sdpa.unsplittable and sdpa.attr("causal", 0) == 1
    )
    with pytest.raises(ModelError, match="kv_heads"):
        load_model("llama:heads=8,kv_heads=3,hidden=256")


def test_fused_attention_keeps_no_scores():
    """Explicit attention saves the b x heads x s x s probabilities (softmax input and output);
    fused attention does not, so its activations are smaller by about that much."""
    spec = "llama:layers=1,hidden=512,heads=8,kv_heads=8,ffn=1024,seq=1024,vocab=1024"
    cluster = make_cluster("1", "a100-80g")
    fused = plan(spec, cluster.mesh, "a100-80g")
    explicit = plan(spec + ",attention=explicit", cluster.mesh, "a100-80g")
    scores = 8 * 8 * 1024 * 1024 * 2  # bytes of one bf16 b x heads x s x s tensor
    gap = (
        dict(explicit.memory_breakdown)["activations"] - dict(fused.memory_breakdown)["activations"]
    )
    assert gap >= scores


def test_mixtral_routing_and_balance_loss():
    graph = load_model(
        "moe:layers=1,hidden=256,heads=8,kv_heads=2,ffn=512,seq=64,vocab=512,experts=4,top_k=2"
    )
    gate = graph.operator("l0.moe.gate")
    assert dict(gate.dims)["c"] == math.ceil(2 * 64 / 4)  # top_k x seq x capacity factor / experts
    aux = graph.operator("l0.moe.aux_loss")  # tokens per expert x mean router probability, summed
    assert aux.kind == "reduce" and "l0.moe.aux_loss" in graph.grad_tensors()


def _moe_layer(experts: int, batch: int, seq: int, hidden: int, ffn: int):
    gb = GraphBuilder("moe-layer")
    x = gb.data("x", (batch, seq, hidden))
    x = gb.op("linear", "pre", "bsh,hk->bsk", [x, gb.param("pre.weight", (hidden, hidden))])
    logits = gb.op(
        "matmul", "router", "bsh,he->bse", [x, gb.param("router.weight", (hidden, experts))]
    )
    gate = gb.op("moe_gate", "gate", "bse->bsec", [logits], sizes={"c": max(1, 2 * seq // experts)})
    routed = gb.op("moe_dispatch", "dispatch", "bsh,bsec->ebch", [x, gate])
    up = gb.op(
        "einsum", "experts.up", "ebch,ehf->ebcf", [routed, gb.param("up", (experts, hidden, ffn))]
    )
    down = gb.op(
        "einsum", "experts.down", "ebcf,efh->ebch", [up, gb.param("down", (experts, ffn, hidden))]
    )
    out = gb.op("moe_combine", "combine", "ebch,bsec->bsh", [down, gate])
    gb.op("reduce", "loss", "bsh->", [out])
    return gb.build()


def test_expert_parallelism_is_rediscovered():
    """64 experts of 256 x 1024 and 1024 tokens (16 per expert) on 4 devices: the tokens stay split
    by sequence (batch) up to the dispatch, an all-to-all sends them to the experts split over the
    devices (16 each), and the results come back: GShard's expert parallelism. It beats every plan
    that does not split the expert dim, and the exact plan equals brute force over all 250,000
    combinations."""
    problem = make_problem(_moe_layer(64, 64, 16, 256, 1024), make_cluster("4", "a100-80g"))
    best, _ = brute_force(problem)
    result = solve(problem)
    assert result.status == "OPTIMAL" and result.objective == best
    chosen = dict(
        zip((t.op.name for t in problem.ops), strategies_from_choice(problem, result.choice))
    )
    assert (
        chosen["experts.up"] == ("e",)
        and chosen["experts.down"] == ("e",)
        and chosen["dispatch"] == ("b",)
    )
    assert {("all_to_all", "fwd"), ("all_to_all", "bwd")} <= {
        (c.kind, c.phase) for c in problem.record(result.choice).comm
    }
    experts = [i for i, t in enumerate(problem.ops) if t.op.name.startswith("experts.")]
    others = [
        range(len(t.strategies))
        if i not in experts
        else [s for s, strategy in enumerate(t.strategies) if "e" not in strategy]
        for i, t in enumerate(problem.ops)
    ]
    best_replicated = min(problem.objective(c) for c in itertools.product(*others))
    assert best < best_replicated


def test_llama3_8b_on_64_h100_is_optimal_and_fits():
    result = plan("llama3-8b", "8x8", "h100-80g")
    assert result.status == "OPTIMAL" and result.fits_memory


@pytest.mark.parametrize(
    "spec,mesh,method",
    [
        ("llama:layers=2,hidden=128,heads=4,kv_heads=2,ffn=256,seq=64,vocab=512", "2x4", "exact"),
        (
            "moe:layers=2,hidden=128,heads=4,kv_heads=2,ffn=256,seq=64,vocab=512,experts=4",
            "2x4",
            "dp",
        ),
    ],
)
def test_small_llama_and_moe_plans_verify(spec, mesh, method):
    """The numpy executor runs the sharded plan (fused causal attention, rotary tables, SwiGLU,
    routing) to the single-device values, and XLA's compiled collectives match the cost model within
    5%."""
    pytest.importorskip("jax")
    from planner.api import plan_problem
    from planner.runs import run_checks
    from planner.engines.predicted import VERIFY_SETTINGS

    cluster = make_cluster(mesh, "a100-80g", float("inf"))
    graph = load_model(spec, batch=8)
    result = plan_problem(make_problem(graph, cluster, VERIFY_SETTINGS), math.inf, method)
    strategies = {a.name: tuple(d for _, d in a.strategy) for a in result.operators}
    assert any(any(s) for s in strategies.values())
    report = run_checks(graph, strategies, cluster.mesh)
    assert report.numpy_max_rel_error < 1e-5 and report.xla_ok, report


@pytest.mark.parametrize("name,published", [("vit-h14", 632e6), ("t5-3b", 2.85e9)])
def test_vit_and_t5_parameter_counts(name, published):
    assert abs(load_model(name).num_params / published - 1) < 0.005


def test_encoder_decoder_past_the_reduction_share_falls_back_within_the_time_limit():
    """T5's decoder reads the encoder output in every layer, so its layers share one segment whose
    kernels are conditioned in sequence; past half the time limit the whole-graph program takes the
    rest, and a plan comes back within the limit."""
    import time
    from planner.zoo.encoders import t5

    graph = t5(layers=12, hidden=256, heads=4, head_dim=64, ffn=1024, vocab=512, seq=64, batch=8)
    start = time.perf_counter()
    result = plan(graph, "8", "h100-80g", time_limit_s=4)
    assert time.perf_counter() - start < 4 + 3
    assert result.status in ("OPTIMAL", "FEASIBLE") and any(
        "whole-graph program" in n for n in result.notes
    )


def test_fused_attention_gemm_shape_by_hand():
    """Its q k^T product: (s x g queries) by t keys over the head dim d, per batch and kv head; a
    shape with N = 1 would price the kernel at 1/128 of the tensor cores."""
    from planner.cost.compute import gemm_shape

    op = load_model(
        "llama:layers=1,hidden=256,heads=8,kv_heads=2,ffn=512,seq=64,vocab=512"
    ).operator("l0.attn.sdpa")
    assert gemm_shape(op, dict(op.sizes)) == (64 * 4, 64, 32, 8 * 2)
