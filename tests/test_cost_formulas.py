"""Cost model v2 against hand-computed numbers (docs/cost-model.md): the roofline on each side of
the ridge point, tile and wave quantisation, overlap that hides fully and partly, gradient
buckets, and the memory Megatron-LM and Korthikanti et al. (2022) count for GPT-3 175B."""

import math
import numpy as np

import pytest

from planner.cluster.mesh import parse_mesh
from planner.cost.collectives import collective_seconds
from planner.cost.compute import op_seconds, quantisation
from planner.cost.operands import operand_infos
from planner.cost.operators import op_cost
from planner.cost.records import seconds
from planner.cost.settings import TrainingSettings
from planner.ir.ops import GraphBuilder
from planner.zoo.transformers import GPTConfig, gpt

# a100-80g and the documented constants
PEAK, GEMM, HBM, LAUNCH, SMS = (312e12, 0.8, 2039e9, 4e-6, 108)


def _matmul(m, k, n):
    gb = GraphBuilder("mm")
    x = gb.op("relu", "in", "bk->bk", [gb.data("x0", (m, k))])
    y = gb.op("matmul", "mm", "bk,kn->bn", [x, gb.param("w", (k, n))])
    gb.op("gelu", "out", "bn->bn", [y])
    return gb.build()


def test_quantisation_by_hand():
    # 4096^3 on 108 SMs: 32 x 32 = 1024 tiles of 128 x 128 in ceil(1024 / 108) = 10 waves
    assert quantisation(4096, 4096, 4096, 1, SMS) == pytest.approx(
        4096 * 4096 / (10 * 108 * 128 * 128)
    )
    # a thin shard: 1000 x 128 is 8 tiles in one wave of 108; K = 96 pads to 128
    assert quantisation(1000, 128, 96, 1, SMS) == pytest.approx(
        1000 * 128 / (108 * 128 * 128) * 96 / 128
    )
    assert quantisation(1000, 128, 96, 1, 0) == 1.0  # SM count unknown: no quantisation


def test_roofline_on_each_side_of_the_ridge(a100):
    mesh = parse_mesh("8", a100)
    big = _matmul(4096, 4096, 4096).operator("mm")  # 2 * 4096^3 FLOPs, 100 MB moved: compute-bound
    flops, io = 2 * 4096**3, 3 * 4096 * 4096 * 2
    t = op_seconds(big, (None,), mesh, a100, flops, io)
    q = quantisation(4096, 4096, 4096, 1, SMS)
    assert t.fwd_s == pytest.approx(flops / (PEAK * GEMM * q) + LAUNCH)
    assert flops / (PEAK * GEMM * q) > io / HBM
    # backward: data gradient (4096 x 4096 over 4096) and weight gradient, same shapes here
    assert t.bwd_s == pytest.approx(2 * flops / (PEAK * GEMM * q) + 2 * LAUNCH)
    # 8 FLOPs per element, 4 bytes moved: HBM-bound
    gelu = _matmul(4096, 4096, 4096).operator("out")
    elements = 4096 * 4096
    t = op_seconds(gelu, (None,), mesh, a100, 8 * elements, 2 * elements * 2)
    assert 8 * elements / 19.5e12 < 4 * elements / HBM
    assert t.fwd_s == pytest.approx(4 * elements / HBM + LAUNCH)
    assert t.bwd_s == pytest.approx(8 * elements / HBM + 2 * LAUNCH)
    v1 = op_seconds(gelu, (None,), mesh, a100.with_overrides(roofline=False), 8 * elements, 0)
    assert v1.fwd_s == pytest.approx(8 * elements / (PEAK * 0.5))  # the datasheet-only model


def test_small_micro_batches_lose_gemm_efficiency(a100):
    """The time per sample of a tensor-parallel shard falls with the micro-batch size
    (quantisation), which is what makes the micro-batch a trade-off against the pipeline bubble."""
    mesh = parse_mesh("8", a100)
    per_sample = []
    for b in (1, 2, 4, 8):
        op = _matmul(2048 * b, 12288, 4 * 12288).operator("mm")
        flops = 2 * 2048 * b * 12288 * 4 * 12288 / 8
        per_sample.append(op_seconds(op, ("n",), mesh, a100, flops, 0.0).fwd_s / b)
    assert per_sample == sorted(per_sample, reverse=True) and per_sample[0] > per_sample[-1] * 1.01


def _dp_weight_cost(batch, a100, **settings):
    graph = _matmul(batch, 1024, 1024)
    mesh = parse_mesh("8", a100)
    chosen = TrainingSettings(**settings)
    return op_cost(
        graph.operator("mm"), ("b",), mesh, chosen, operand_infos(graph, chosen)["mm"], a100
    ), mesh


def test_gradient_reduction_hides_fully_behind_a_long_backward(a100):
    record, mesh = _dp_weight_cost(65536, a100, overlap="grad", bucket_bytes=0)
    ring = collective_seconds("all_reduce", 8, 300e9, 2e-6, 1024 * 1024 * 2)
    assert record.bwd_s > ring and record.hidden_sync_s == pytest.approx(ring)
    assert seconds(record, mesh, a100) == pytest.approx(record.fwd_s + record.bwd_s + record.opt_s)


def test_gradient_reduction_hides_partly_behind_a_short_backward(a100):
    record, mesh = _dp_weight_cost(64, a100, overlap="grad", bucket_bytes=0)
    ring = collective_seconds("all_reduce", 8, 300e9, 2e-6, 1024 * 1024 * 2)
    assert record.bwd_s < ring and record.hidden_sync_s == pytest.approx(record.bwd_s)
    exposed = ring - record.bwd_s
    assert seconds(record, mesh, a100) == pytest.approx(
        record.fwd_s + record.bwd_s + record.opt_s + exposed
    )
    none, _ = _dp_weight_cost(64, a100, overlap="none", bucket_bytes=0)
    assert none.hidden_sync_s == 0 and seconds(none, mesh, a100) > seconds(record, mesh, a100)


def test_buckets_pay_the_latency_once_per_bucket(a100):
    grad_bytes = 1024 * 1024 * 2
    bucketed, _ = _dp_weight_cost(64, a100, overlap="none", bucket_bytes=8 * grad_bytes)
    per_tensor, _ = _dp_weight_cost(64, a100, overlap="none", bucket_bytes=0)
    (b,), (p,) = bucketed.comm, per_tensor.comm
    assert (b.count, p.count) == (pytest.approx(1 / 8), 1.0)  # this tensor's share of one bucket
    latency = 2 * 7 * 2e-6  # a ring all-reduce on 8 devices: 2 (p - 1) steps
    assert collective_seconds("all_reduce", 8, 300e9, 2e-6, b.nbytes, b.count) == pytest.approx(
        collective_seconds("all_reduce", 8, 300e9, 2e-6, p.nbytes, p.count) - latency * 7 / 8
    )


def test_a_tensor_larger_than_a_bucket_is_one_collective_of_its_own(a100):
    """DDP, FSDP2 and Megatron's distributed optimizer pack small tensors into buckets and issue a
    tensor larger than a bucket as one collective: it pays one collective's latency, never one per
    bucket-sized slice (which priced ZeRO-3 on 384 GPUs at 168 s instead of about 54 s)."""
    grad_bytes = 1024 * 1024 * 2
    small_bucket, _ = _dp_weight_cost(64, a100, overlap="none", bucket_bytes=grad_bytes / 16)
    (b,) = small_bucket.comm
    assert b.count == 1.0
    zero3, _ = _dp_weight_cost(64, a100, overlap="none", zero=3, bucket_bytes=grad_bytes / 16)
    assert sorted((c.phase, c.kind, c.count) for c in zero3.comm) == [
        ("bwd", "all_gather", 1.0),
        ("fwd", "all_gather", 1.0),
        ("reduce", "reduce_scatter", 1.0),
    ]
    # exactly one ring's latency per collective: 7 steps on 8 devices, plus the bytes
    gather = next(c for c in zero3.comm if c.phase == "fwd")
    assert collective_seconds(
        "all_gather", 8, 300e9, 2e-6, gather.nbytes, gather.count
    ) == pytest.approx(7 * 2e-6 + 7 / 8 * gather.nbytes / 300e9)


def test_zero3_at_scale_is_priced_by_its_bytes():
    """175B on 384 A100s with ZeRO-3 (the case that was 168 s): a ring all-gather of 350 GB of bf16
    weights over 384 GPUs moves ~349 GB per GPU, ~14 s per pass at 25 GB/s; the iteration is under
    100 s once a large tensor pays one collective's latency."""
    from planner import api3d
    from planner.cost.settings import TrainingSettings

    plan = api3d.evaluate_3d(
        "gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200",
        "a100-80g",
        dp=384,
        micro_batch=4,
        batch=1536,
        settings=TrainingSettings(zero=3, recompute="full"),
    )
    assert plan.pipeline.iteration_time_s < 100
    unbucketed = api3d.evaluate_3d(
        "gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200",
        "a100-80g",
        dp=384,
        micro_batch=4,
        batch=1536,
        settings=TrainingSettings(zero=3, recompute="full", bucket_bytes=0),
    )
    # buckets only ever merge latency
    assert plan.pipeline.iteration_time_s <= unbucketed.pipeline.iteration_time_s


def test_fp32_main_gradients_count_18_bytes_per_parameter(a100):
    record, _ = _dp_weight_cost(64, a100, fp32_grads=True)
    numel = 1024 * 1024
    assert record.memory.params + record.memory.grads + record.memory.optimizer == 18 * numel
    assert record.comm[0].nbytes == 4 * numel  # the reduction moves fp32 gradients


GPT3 = GPTConfig(layers=1, hidden=12288, heads=96, seq=2048, vocab=51200, dropout=1)


def _megatron_strategy(op, tp: int, sequence_parallel: bool) -> tuple:
    """Megatron's layer on one tensor-parallel axis: heads and the MLP hidden dim split; under
    sequence parallelism the norms, dropouts and residual adds split the sequence."""
    dims = op.sizes
    if tp == 1:
        return (None,)
    if "a" in dims or "f" in dims:
        return ("a",) if "a" in dims else ("f",)
    return ("s",) if sequence_parallel and "s" in dims else (None,)


def _layer_activation_bytes(
    a100, tp: int, sequence_parallel: bool = False, recompute: str = "none"
) -> float:
    """Saved activations of one GPT-3 175B layer (micro-batch 1) under Megatron tensor
    parallelism."""
    graph = gpt(GPT3, batch=1)
    settings = TrainingSettings(sequence_parallel=sequence_parallel, recompute=recompute)
    infos = operand_infos(graph, settings)
    mesh = parse_mesh(str(tp), a100)
    return sum(
        op_cost(
            op, _megatron_strategy(op, tp, sequence_parallel), mesh, settings, infos[op.name], a100
        ).memory.activations
        for op in graph.operators
        if op.layer == 0
    )


@pytest.mark.parametrize("tp", [1, 8])
def test_activations_per_layer_match_korthikanti(a100, tp):
    """Korthikanti et al. 2022, bytes per layer: s b h (10 + 24 / t + 5 a s / (h t)) under tensor
    parallelism (t = 1: s b h (34 + 5 a s / h)); the model's saved tensors and dropout masks."""
    s, b, h, a = 2048, 1, 12288, 96
    expected = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
    assert _layer_activation_bytes(a100, tp) == pytest.approx(expected, rel=0.05)


def test_sequence_parallel_activations_match_korthikanti(a100):
    """With sequence parallelism every term is divided by t: s b h (34 / t + 5 a s / (h t)); with
    selective recompute on top the attention core's 5 a s / h term goes: s b h 34 / t."""
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    assert _layer_activation_bytes(a100, t, True) == pytest.approx(
        s * b * h * (34 / t + 5 * a * s / (h * t)), rel=0.05
    )
    assert _layer_activation_bytes(a100, t, True, "selective") == pytest.approx(
        s * b * h * 34 / t, rel=0.05
    )
    assert _layer_activation_bytes(a100, t, False, "selective") == pytest.approx(
        s * b * h * (10 + 24 / t), rel=0.05
    )


def test_sequence_parallel_regathers_the_saved_input_in_the_backward_pass(a100):
    """q keeps 1/t of the normalised input and all-gathers it back in the backward pass (k and v
    read the same saved copy); without sequence parallelism there is no such gather."""
    graph = gpt(GPTConfig(layers=1, hidden=256, heads=4, seq=128, vocab=1024), batch=2)
    mesh = parse_mesh("4", a100)
    op = graph.operator("h0.attn.q")
    gathers = {}
    for sp in (False, True):
        settings = TrainingSettings(sequence_parallel=sp)
        record = op_cost(op, ("a",), mesh, settings, operand_infos(graph, settings)[op.name], a100)
        gathers[sp] = [c for c in record.comm if c.phase == "bwd" and c.kind == "all_gather"]
        assert record.memory.activations == 2 * 128 * 256 * 2 / (4 if sp else 1)
    assert not gathers[False]
    assert [c.nbytes for c in gathers[True]] == [2 * 128 * 256 * 2]


def test_selective_recompute_reruns_the_attention_core_only(a100):
    """Selective recompute re-runs the scores, the softmax and its dropout: backward compute grows
    by exactly their forward FLOPs, and nothing else changes."""
    graph = gpt(GPTConfig(layers=1, hidden=256, heads=4, seq=128, vocab=1024, dropout=1), batch=2)
    mesh = parse_mesh("1", a100)
    totals = {}
    for recompute in ("none", "selective"):
        settings = TrainingSettings(recompute=recompute)
        infos = operand_infos(graph, settings)
        totals[recompute] = sum(
            op_cost(op, (None,), mesh, settings, infos[op.name], a100).bwd_flops
            for op in graph.operators
        )
    core = sum(graph.operator(f"h0.attn.{n}").flops for n in ("scores", "softmax", "dropout"))
    assert totals["selective"] - totals["none"] == pytest.approx(core)


def test_weights_gradients_optimizer_match_megatron(a100):
    """GPT-3 175B at t = 8, p = 8: 12 layers per stage, 18 bytes per parameter (fp32 main
    gradients), parameters divided by t (Megatron's count: 12 h^2 + 13 h per layer)."""
    graph = gpt(GPTConfig(layers=12, hidden=12288, heads=96, seq=2048, vocab=51200), batch=1)
    settings = TrainingSettings(fp32_grads=True)
    infos = operand_infos(graph, settings)
    mesh = parse_mesh("8", a100)
    static = 0.0
    for op in graph.operators:
        if op.layer is None:
            continue
        dims = op.sizes
        strategy = ("a",) if "a" in dims else ("f",) if "f" in dims else (None,)
        m = op_cost(op, strategy, mesh, settings, infos[op.name], a100).memory
        static += m.params + m.grads + m.optimizer
    h = 12288
    megatron = 18 * 12 * (12 * h * h + 13 * h) / 8
    assert static == pytest.approx(megatron, rel=0.02)
    assert math.isfinite(static)


def test_stage_sends_once_per_boundary_split_over_tensor_parallel_ranks(a100):
    """The residual stream leaving a layer is read twice by the next (norm and residual add) but
    sent once, and each of the t ranks that hold it replicated sends 1/t (Megatron's
    scatter/gather)."""
    from planner.pipeline.layer_costs import cost_layers

    graph = gpt(GPTConfig(layers=2, hidden=256, heads=4, seq=128, vocab=1024), batch=4)
    mesh = parse_mesh("4", a100)
    strategies = {
        op.name: ("a",) if "a" in op.sizes else ("f",) if "f" in op.sizes else (None,)
        for op in graph.operators
    }
    out = cost_layers(graph, mesh, a100, TrainingSettings(), strategies)
    assert out["out_bytes"][0] == 4 * 128 * 256 * 2 / 4


def test_tied_embedding_copy_and_recompute_working_set_in_the_layer_chain(a100):
    """The LM head reads the token embedding on the last layer: that layer's stage holds a copy
    (weights, gradients, Adam state: 16 bytes per parameter) whose gradient is all-reduced with
    the first stage's. Under full recompute a layer keeps its input only, and re-running it
    materialises the rest again (its working set)."""
    from planner.pipeline.layer_costs import cost_layers

    graph = gpt(GPTConfig(layers=2, hidden=256, heads=4, seq=128, vocab=1024), batch=4)
    mesh = parse_mesh("1", a100)
    strategies = {op.name: (None,) for op in graph.operators}
    plain = cost_layers(graph, mesh, a100, TrainingSettings(), strategies)
    assert plain["tied"] == [(0, 1, 1024 * 256 * (2 + 2 + 12), 1024 * 256 * 2)]
    tokens = 4 * 128
    # without recompute the working set is the loss's backward: two fp32 buffers the size of its
    # kept softmax and labels (PyTorch's nll_loss_backward and _log_softmax_backward_data)
    assert list(plain["working_memory"]) == [0, 2 * tokens * (1024 * 4 + 4)]
    full = cost_layers(graph, mesh, a100, TrainingSettings(recompute="full"), strategies)
    rerun = plain["activation_memory"] - full["activation_memory"]
    assert full["working_memory"] == pytest.approx(np.maximum(rerun, plain["working_memory"]))
    # the last layer keeps its input; the final norm, head and loss joined to it are not re-run
    # (Megatron-LM checkpoints the transformer layers only; torchtitan wraps each block), so they
    # keep what they save: the final norm's input, the head's input, the loss's softmax of the
    # logits (fp32, as both engines keep it) and the labels (int32)
    assert full["activation_memory"][1] == tokens * (3 * 256 * 2 + 1024 * 4 + 4)
    # the re-run materialises one layer again: the same working set in both layers (the
    # embedding and the head, outside the re-run, add none), many times the kept input
    assert full["working_memory"][0] == full["working_memory"][1] > 10 * tokens * 256 * 2


def test_a_tensor_that_skips_a_stage_is_sent_at_every_boundary_it_crosses(a100):
    """An encoder output made in layer 0 and read in layers 1 and 2 (T5's cross-attention) is handed
    on by the stage between, as the runners and `verify` send it: the boundary after layer 1 carries
    it with layer 1's own output (it was charged after layer 0 only: half the bytes there)."""
    from planner.ir.crossing import crossing_tensors
    from planner.pipeline.layer_costs import cost_layers

    gb = GraphBuilder("skip")
    x = gb.data("x", (8, 64))
    gb.layer = 0
    enc = gb.op("relu", "encoder", "bk->bk", [x])
    gb.layer = 1
    h1 = gb.op("relu", "decoder1", "bk->bk", [enc])
    gb.layer = 2
    gb.op("add", "decoder2", "bk,bk->bk", [h1, enc])
    graph = gb.build()
    position = {op.name: op.layer for op in graph.operators}
    assert crossing_tensors(graph, position, 3) == [["encoder"], ["decoder1", "encoder"]]
    mesh = parse_mesh("4", a100)
    out = cost_layers(
        graph, mesh, a100, TrainingSettings(), {op.name: (None,) for op in graph.operators}
    )
    one = 8 * 64 * 2 / 4  # bf16, each of the 4 ranks holding it replicated sends 1/4
    assert list(out["out_bytes"]) == [one, 2 * one, 0.0]
