"""The models people train now, through ``torch.export``: LLaMA, ViT, T5 and BERT import with no
unknown operator, count their parameters as torch does, and their plans verify."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from planner.api import make_cluster, make_problem, plan_problem  # noqa: E402
from planner.engines.torch.importer import import_module  # noqa: E402
from planner.engines.torch.presets import build_spec  # noqa: E402

PRESETS = ("hf:llama", "hf:mixtral", "hf:vit", "hf:t5", "hf:bert")
_CACHE: dict = {}


def _imported(spec: str):
    if spec not in _CACHE:
        module, inputs, name = build_spec(spec)
        _CACHE[spec] = (module, import_module(module, inputs, name=name))
    return _CACHE[spec]


@pytest.mark.parametrize("spec", PRESETS)
def test_imports_with_no_unknown_operator_and_torch_parameter_count(spec):
    module, graph = _imported(spec)
    assert not [op.name for op in graph.operators if op.kind == "opaque"]
    assert graph.num_params == sum(p.numel() for p in module.parameters())
    # scaled_dot_product_attention, fused
    assert any(op.kind == "attention" for op in graph.operators)
    # topk routing, grouped matmuls and scatter written as GShard's dispatch/combine
    if spec == "hf:mixtral":
        assert {"moe_gate", "moe_dispatch", "moe_combine"} <= {op.kind for op in graph.operators}


def test_llama_forward_flops_by_hand():
    """hf:llama (2 layers, hidden 128, 4 heads of 32, 2 kv heads, FFN 256, vocab 512, batch 2 x seq
    64): 2 FLOPs per multiply-add of every projection (q, o: 128x128; k, v: 128x64; gate, up, down:
    128x256) and the LM head (128x512) over 128 tokens, plus 4 x b x heads x s x s x d for
    attention."""
    _, graph = _imported("hf:llama")
    tokens, h = 2 * 64, 128
    linears = 2 * tokens * (2 * (2 * h * h + 2 * h * 64 + 3 * h * 256) + h * 512)
    attention = 2 * 4 * 2 * 4 * 64 * 64 * 32
    assert sum(op.flops for op in graph.operators if op.kind == "linear") == linears
    assert sum(op.flops for op in graph.operators if op.kind == "attention") == attention


def test_rmsnorm_rotary_and_gqa_map_onto_registered_kinds():
    _, graph = _imported("hf:llama")
    kinds = {op.kind for op in graph.operators}
    assert {
        "mean",
        "slice",
        "concat",
        "silu",
        "attention",
    } <= kinds  # RMSNorm, rotate_half, SwiGLU, SDPA


@pytest.mark.parametrize(
    "spec,mesh,method",
    [
        ("hf:llama", "2x2", "exact"),
        ("hf:llama", "4", "greedy"),
        ("hf:vit:batch=8", "2x2", "exact"),
        ("hf:t5:batch=8", "2x2", "exact"),
        ("hf:bert", "2", "dp"),
        ("hf:mixtral:batch=8", "2", "dp"),
        ("hf:mixtral:batch=8", "2", "exact"),
    ],
)
def test_imported_plans_verify(spec, mesh, method):
    """The numpy executor reproduces the single-device values from the sharded plan, and XLA's
    compiled collectives match the cost model within 5% (a greedy LLaMA plan splits the RMSNorm
    mean)."""
    pytest.importorskip("jax")
    from planner.runs import run_checks
    from planner.engines.predicted import VERIFY_SETTINGS

    _, graph = _imported(spec)
    cluster = make_cluster(mesh, "a100-80g", float("inf"))
    result = plan_problem(make_problem(graph, cluster, VERIFY_SETTINGS), math.inf, method)
    strategies = {a.name: tuple(d for _, d in a.strategy) for a in result.operators}
    assert any(any(s) for s in strategies.values())
    report = run_checks(graph, strategies, cluster.mesh)
    assert report.numpy_max_rel_error < 1e-5 and report.xla_ok, report


def test_imported_mixtral_experts_reach_the_loss():
    """The routing region ends at the sum over the k picks of [tokens, k, hidden] (not at the sum
    that normalises the top-k weights): the combine feeds the residual, so the experts' weights
    change the loss."""
    import numpy as np
    from planner.engines.interpret import random_feeds, run_graph

    _, graph = _imported("hf:mixtral")
    feeds = random_feeds(graph)
    loss = graph.operators[-1].outputs[0].tensor
    expert = next(
        t.name for t in graph.tensors if t.role == "param" and "experts.down_proj" in t.name
    )
    changed = dict(feeds, **{expert: feeds[expert] * 2})
    assert run_graph(graph, feeds, np)[loss] != run_graph(graph, changed, np)[loss]


def test_vit_and_bert_forward_flops_by_hand():
    """hf:vit: 2 images of 32x32 in 8x8 patches -> 16 + 1 tokens of 128; per layer q, k, v, o
    (128x128) and the MLP (128x256, 256x128) over 34 tokens, attention 4 x 2 x 4 heads x 17 x 17 x
    32; the patch convolution 2 x 2 x 16 x 192 x 128 and the head (128x10) on the class tokens.
    hf:bert: 2 x 64 tokens, FFN 512, the MLM transform (128x128) and decoder (128x1024)."""
    _, vit = _imported("hf:vit")
    linears = 2 * 34 * 2 * (4 * 128 * 128 + 2 * 128 * 256) + 2 * 2 * 128 * 10
    assert sum(op.flops for op in vit.operators if op.kind == "linear") == linears
    assert (
        sum(op.flops for op in vit.operators if op.kind == "attention")
        == 2 * 4 * 2 * 4 * 17 * 17 * 32
    )
    assert (
        sum(op.flops for op in vit.operators if op.kind == "conv2d") == 2 * 2 * 16 * 3 * 8 * 8 * 128
    )
    _, bert = _imported("hf:bert")
    linears = 2 * 128 * (2 * (4 * 128 * 128 + 2 * 128 * 512) + 128 * 128 + 128 * 1024)
    assert sum(op.flops for op in bert.operators if op.kind == "linear") == linears
    assert (
        sum(op.flops for op in bert.operators if op.kind == "attention")
        == 2 * 4 * 2 * 4 * 64 * 64 * 32
    )


def _linear_roles(graph, strategies):
    """Per weight-matrix op in graph order: 'col' (splits the weight's output letter), 'row' (a
    contraction letter) or '-' (replicated), on the one mesh axis."""
    from planner.search.roles import _weight_letters

    roles = []
    for op, strategy in zip(graph.operators, strategies):
        produced, contracted = _weight_letters(graph, op)
        if op.kind == "linear":
            roles.append(
                "col" if strategy[0] == produced else "row" if strategy[0] in contracted else "-"
            )
    return roles


@pytest.mark.parametrize(
    "spec,per_layer",
    [
        # c_attn, c_proj, c_fc, c_proj
        (
            "hf:gpt2:layers=2,hidden=256,heads=4,seq=64,vocab=512,batch=8",
            ["col", "row", "col", "row"],
        ),
        # q, k, v, o, gate, up, down
        ("hf:llama", ["col", "col", "col", "row", "col", "col", "row"]),
    ],
)
def test_baselines_follow_the_data_flow_on_imported_graphs(spec, per_layer):
    """import-torch names letters by position (a view that merges batch and sequence calls it 'a'),
    so the baselines find the batch and Megatron's splits by following the data flow
    (search/roles.py): data parallelism splits the batch in every operator that carries it, and
    Megatron's pattern is column then row parallel per block, with the vocabulary split in the token
    embedding and LM head."""
    import planner
    from planner.search.baselines import data_parallel, megatron
    from planner.search.roles import batch_letters

    graph = (
        _imported(spec)[1]
        if spec == "hf:llama"
        else planner.import_torch(spec, loss="cross_entropy")
    )
    assert graph.dim_names == "positional"
    # hf:llama's batch is 2
    problem = make_problem(graph, make_cluster("2", "a100-80g", float("inf")))
    batches = batch_letters(graph)
    # GPT-2's Conv1D runs on (batch x sequence): views merge them under another letter
    if spec != "hf:llama":
        assert any(b not in (None, graph.batch_dim) for b in batches), batches
    assert [s[0] for s, b in zip(data_parallel(problem), batches) if b is not None] == [
        b for b in batches if b
    ]
    chosen = megatron(problem)
    roles = _linear_roles(graph, chosen)
    layers = (len(roles) - 1) // len(per_layer)
    # the LM head: vocabulary-parallel
    assert layers == 2 and roles == per_layer * layers + ["col"], roles
    token, position = (
        (s[0] for op, s in zip(graph.operators, chosen) if op.kind == "embedding")
        if spec != "hf:llama"
        else (next(s[0] for op, s in zip(graph.operators, chosen) if op.kind == "embedding"), None)
    )
    assert token is not None and position is None  # vocabulary-parallel; position table replicated
