"""Symbolic costs against hand-computed numbers (docs/cost-model.md): cost model v1's terms (compute
as flops / (peak x efficiency), no overlap, one collective per parameter tensor). The v2 terms
(roofline, overlap, buckets) have their own hand-computed tests in tests/test_cost_formulas.py."""

import pytest

from planner.cost.operands import operand_infos
from planner.cost.operators import op_cost
from planner.cost.records import accumulated, seconds
from planner.cost.redistribution import edge_cost
from planner.cost.settings import TrainingSettings
from planner.cluster.mesh import parse_mesh
from planner.ir.ops import GraphBuilder
from planner.cost.strategy import (
    GRAD_PARTIAL,
    PARTIAL,
    REPLICATE,
    enumerate_strategies,
    operand_layout,
)

B, K, N = 64, 128, 256
V1_SETTINGS = TrainingSettings(overlap="none", bucket_bytes=0)
P = 8
BF16 = 2


def matmul_graph():
    gb = GraphBuilder("mm")
    x0 = gb.data("x0", (B, K))
    x = gb.op("gelu", "act", "bk->bk", [x0])  # x is an activation: it needs a gradient
    w = gb.param("w", (K, N))
    y = gb.op("matmul", "mm", "bk,kn->bn", [x, w])
    gb.op("gelu", "consumer", "bn->bn", [y])
    return gb.build()


@pytest.fixture(scope="module")
def setup(a100):
    graph = matmul_graph()
    mesh = parse_mesh("8", a100)
    settings = V1_SETTINGS
    infos = operand_infos(graph, settings)
    return graph, mesh, settings, infos


def V1(profile):
    return profile.with_overrides(roofline=False)


def ring(kind, nbytes, bw=300e9, lat=2e-6, p=P):
    factor = 2 if kind == "all_reduce" else 1
    return factor * ((p - 1) * lat + (p - 1) / p * nbytes / bw)


def test_enumeration_respects_divisibility(setup):
    graph, mesh, _, _ = setup
    op = graph.operator("mm")
    assert enumerate_strategies(op, mesh) == [(None,), ("b",), ("k",), ("n",)]
    gb = GraphBuilder("odd")
    x = gb.data("x", (6, 8))
    gb.op("matmul", "mm", "bk,kn->bn", [x, gb.param("w", (8, 12))])
    assert enumerate_strategies(gb.build().operator("mm"), mesh) == [(None,), ("k",)]


def test_split_batch_costs_compute_over_8_and_weight_allreduce(setup, a100):
    graph, mesh, settings, infos = setup
    op = graph.operator("mm")
    full = op_cost(op, (None,), mesh, settings, infos["mm"], V1(a100))
    rec = op_cost(op, ("b",), mesh, settings, infos["mm"], V1(a100))
    assert full.fwd_flops == 2 * B * K * N
    assert rec.fwd_flops == 2 * B * K * N / 8
    assert rec.bwd_flops == 2 * rec.fwd_flops
    assert [(c.kind, c.phase, c.nbytes) for c in rec.comm] == [("all_reduce", "grad", K * N * BF16)]
    expected = 3 * 2 * B * K * N / 8 / (312e12 * 0.5) + ring("all_reduce", K * N * BF16)
    assert seconds(rec, mesh, V1(a100)) == pytest.approx(expected, rel=1e-12)


def test_split_n_makes_input_gradient_partial(setup, a100):
    graph, mesh, settings, infos = setup
    op = graph.operator("mm")
    rec = op_cost(op, ("n",), mesh, settings, infos["mm"], V1(a100))
    assert rec.comm == ()  # the weight is sharded, nothing to sync
    x_layout = operand_layout(op.inputs[0], ("n",), output=False, needs_grad=True)
    assert x_layout == (GRAD_PARTIAL,)
    edge = edge_cost((B, K), BF16, (REPLICATE,), x_layout, mesh.shape, True)
    assert [(c.kind, c.phase, c.nbytes) for c in edge.comm] == [("all_reduce", "bwd", B * K * BF16)]
    assert seconds(edge, mesh, a100) == pytest.approx(ring("all_reduce", B * K * BF16))


def test_split_k_leaves_output_partial(setup, a100):
    graph, mesh, settings, infos = setup
    op = graph.operator("mm")
    assert operand_layout(op.outputs[0], ("k",), output=True) == (PARTIAL,)
    rec = op_cost(op, ("k",), mesh, settings, infos["mm"], V1(a100))
    assert rec.comm == ()
    edge = edge_cost((B, N), BF16, (PARTIAL,), (REPLICATE,), mesh.shape, True)
    assert [(c.kind, c.phase, c.nbytes) for c in edge.comm] == [("all_reduce", "fwd", B * N * BF16)]
    assert seconds(edge, mesh, a100) == pytest.approx(ring("all_reduce", B * N * BF16))


def test_memory_of_strategies(setup, a100):
    graph, mesh, settings, infos = setup
    op = graph.operator("mm")
    rec = op_cost(op, ("n",), mesh, settings, infos["mm"], V1(a100))
    assert rec.memory.params == K * N * BF16 / 8
    assert rec.memory.grads == K * N * BF16 / 8
    assert rec.memory.optimizer == K * N * 12 / 8
    assert rec.memory.activations == B * K * BF16  # x saved, replicated
    zero = op_cost(
        op,
        ("b",),
        mesh,
        TrainingSettings(zero=3, overlap="none", bucket_bytes=0),
        infos["mm"],
        V1(a100),
    )
    assert zero.memory.params == K * N * BF16 / 8 and zero.memory.optimizer == K * N * 12 / 8
    kinds = sorted((c.kind, c.phase) for c in zero.comm)
    assert kinds == [("all_gather", "bwd"), ("all_gather", "fwd"), ("reduce_scatter", "reduce")]


def test_layernorm_split_of_normalised_dim_allreduces_statistics(a100):
    gb = GraphBuilder("ln")
    x = gb.data("x", (4, 16, 64))
    gb.op(
        "layernorm", "ln", "bsh,h,h->bsh", [x, gb.param("g", (64,)), gb.param("b", (64,))], norm="h"
    )
    graph = gb.build()
    mesh = parse_mesh("8", a100)
    infos = operand_infos(graph, TrainingSettings())
    rec = op_cost(graph.operator("ln"), ("h",), mesh, TrainingSettings(), infos["ln"], V1(a100))
    stats = 2 * 4 * 16 * BF16
    assert sorted((c.kind, c.phase, c.nbytes) for c in rec.comm) == [
        ("all_reduce", "bwd", stats),
        ("all_reduce", "fwd", stats),
    ]


@pytest.mark.parametrize("zero, reductions", [(1, 1), (2, 3), (3, 3)])
def test_zero_2_and_3_reduce_scatter_every_micro_batch(setup, a100, zero, reductions):
    """By hand, 3 micro-batches of the data-parallel matmul: ZeRO-1 keeps the whole gradient and
    reduce-scatters it once a step (Megatron-LM's distributed optimizer); ZeRO-2/3 keep only the
    shard, so each micro-batch's backward reduce-scatters its gradient (FSDP2's default,
    pytorch/pytorch#126166; DeepSpeed stage 2/3): 3 reduce-scatters of K x N bf16 on 8 devices,
    plus ZeRO-3's two gathers per micro-batch."""
    graph, mesh, _, infos = setup
    settings = TrainingSettings(zero=zero, overlap="none", bucket_bytes=0)
    one = op_cost(graph.operator("mm"), ("b",), mesh, settings, infos["mm"], V1(a100))
    three = accumulated(one, 3)
    gathers = (
        3 * 2 * ring("all_gather", K * N * BF16) if zero == 3 else ring("all_gather", K * N * BF16)
    )
    expected = 3 * (one.fwd_s + one.bwd_s) + reductions * ring("reduce_scatter", K * N * BF16)
    assert seconds(three, mesh, V1(a100)) == pytest.approx(expected + gathers, rel=1e-12)
