"""Memory as the engines hold it, checked against the engines' own accounting.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"), Table 2:
bytes of activations per transformer layer, from the graph's saved tensors under the stage plan
that `planner evaluate --tp` uses (Megatron-LM's pattern; with sequence parallelism its norms,
dropouts and residual adds split the sequence). megatron-core's own estimator
(megatron/training/theoretical_memory_usage.py, in the wheel that .ci/run installs) is called on
the same configurations.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types
from argparse import Namespace
from importlib.util import find_spec
from pathlib import Path

import pytest

from planner import api3d
from planner.cluster.mesh import parse_mesh
from planner.cost.operands import operand_infos
from planner.cost.operators import op_cost
from planner.cost.problem import build_problem
from planner.cost.settings import TrainingSettings
from planner.search.baselines import megatron
from planner.zoo.transformers import GPTConfig, gpt

S, B, H, A = 2048, 1, 12288, 96  # GPT-3 175B's layer (Korthikanti's Table 3 model)
GPT3_LAYER = GPTConfig(layers=1, hidden=H, heads=A, seq=S, vocab=51200, dropout=1)


def _layer_bytes(a100, t: int, sequence_parallel: bool, recompute: str) -> float:
    """Activations one layer keeps, micro-batch 1, under the stage plan `evaluate --tp t` uses."""
    graph = gpt(GPT3_LAYER, batch=B)
    settings = TrainingSettings(sequence_parallel=sequence_parallel, recompute=recompute)
    problem = build_problem(graph, parse_mesh(str(t), a100), a100, settings)
    plan = megatron(problem)
    infos = operand_infos(graph, settings)
    return sum(
        op_cost(op, plan[i], problem.mesh, settings, infos[op.name], a100).memory.activations
        for i, op in enumerate(graph.operators)
        if op.layer == 0
    )


# (t, sequence parallel, recompute, Korthikanti's Table 2 bytes per layer / (s b h))
TABLE2 = [
    (1, False, "none", 34 + 5 * A * S / H),  # no parallelism
    (8, False, "none", 10 + 24 / 8 + 5 * A * S / (H * 8)),  # tensor parallel (baseline)
    (8, True, "none", 34 / 8 + 5 * A * S / (H * 8)),  # tensor + sequence parallel
    (8, False, "selective", 10 + 24 / 8),  # tensor parallel + selective recompute
    (8, True, "selective", 34 / 8),  # tensor + sequence parallel + selective recompute
    (8, False, "full", 2),  # full recompute: the layer input
    # with sequence parallelism the checkpointed input is the sequence-sharded hidden state
    # (Megatron-LM refuses distribute_saved_activations beside it for that reason)
    (8, True, "full", 2 / 8),
]


@pytest.mark.parametrize("t, sp, recompute, per_sbh", TABLE2)
def test_korthikanti_table2_rows_from_the_graph(a100, t, sp, recompute, per_sbh):
    assert _layer_bytes(a100, t, sp, recompute) == pytest.approx(S * B * H * per_sbh, rel=1e-12)


def _megatron_memory_module():
    """megatron-core's estimator, loaded from the installed wheel without importing
    megatron.training (which needs Python 3.12 and a GPU stack); its two helpers are stubbed (a
    hybrid-model check, false for GPT, and a print on rank 0)."""
    root = Path(find_spec("megatron").submodule_search_locations[0]) / "training"
    package = types.ModuleType("_megatron_training")
    package.__path__ = []
    utils = types.ModuleType("_megatron_training.utils")
    utils.is_hybrid_model = lambda args: False
    utils.print_rank_0 = lambda *a, **k: None
    sys.modules.update({"_megatron_training": package, "_megatron_training.utils": utils})
    spec = importlib.util.spec_from_file_location(
        "_megatron_training.theoretical_memory_usage", root / "theoretical_memory_usage.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _megatron_args(cfg: GPTConfig, tp, pp, dp, micro_batch, vpp, distributed_optimizer):
    """The arguments megatron-core's estimator reads, for a GPT of the zoo (LayerNorm, GeLU MLP of
    4h, multi-head attention, tied embeddings, Megatron's padded vocabulary)."""
    return Namespace(
        kv_channels=cfg.hidden // cfg.heads,
        num_attention_heads=cfg.heads,
        hidden_size=cfg.hidden,
        group_query_attention=False,
        num_query_groups=cfg.heads,
        num_experts=None,
        swiglu=False,
        moe_shared_expert_intermediate_size=None,
        mtp_num_layers=None,
        normalization="LayerNorm",
        multi_latent_attention=False,
        padded_vocab_size=cfg.vocab,
        untie_embeddings_and_output_weights=False,
        ffn_hidden_size=4 * cfg.hidden,
        moe_latent_size=None,
        moe_router_topk=2,
        add_bias_linear=True,
        num_layers=cfg.layers,
        pipeline_model_parallel_size=pp,
        tensor_model_parallel_size=tp,
        data_parallel_size=dp,
        expert_tensor_parallel_size=1,
        expert_model_parallel_size=1,
        world_size=tp * pp * dp,
        use_distributed_optimizer=distributed_optimizer,
        seq_length=cfg.seq,
        micro_batch_size=micro_batch,
        virtual_pipeline_model_parallel_size=vpp,
        sequence_parallel=True,
        recompute_granularity="selective",
    )


GPT3 = GPTConfig(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200, dropout=1)
GPT13B = GPTConfig(layers=40, hidden=5120, heads=40, seq=2048, vocab=51200, dropout=1)
# (model, tp, pp, dp, micro-batch, micro-batches, virtual stages, distributed optimizer)
CONFIGS = [
    (GPT3, 8, 8, 4, 1, 16, None, False),  # TP + PP, 1F1B
    (GPT3, 8, 8, 4, 1, 16, None, True),  # distributed optimizer
    (GPT3, 8, 8, 4, 1, 16, 3, False),  # interleaved, 3 chunks per rank
    (GPT3, 8, 16, 2, 2, 4, None, True),  # fewer micro-batches than stages
    (GPT13B, 4, 4, 8, 2, 8, None, False),
    (GPT13B, 8, 2, 2, 1, 8, 2, True),
    (GPT13B, 8, 1, 4, 1, 4, None, True),  # no pipeline: the output layer and loss on stage 0
]


@pytest.mark.skipif(find_spec("megatron") is None, reason="megatron-core not installed")
@pytest.mark.parametrize("cfg, tp, pp, dp, mb, count, vpp, dist_opt", CONFIGS)
def test_first_stage_matches_megatron_core_theoretical_memory(
    cfg, tp, pp, dp, mb, count, vpp, dist_opt
):
    """Weights, fp32 main gradients and Adam state (18 bytes a parameter; 6 + 12/d with the
    distributed optimizer) and the activations of the in-flight micro-batches on the first stage
    (sequence parallelism and selective recompute, the case the estimator covers), each within 1%
    of megatron-core's figures (which count no recompute working set: the planner reports it as a
    part of its own)."""
    module = _megatron_memory_module()
    args = _megatron_args(cfg, tp, pp, dp, mb, vpp, dist_opt)
    plan = api3d.evaluate_3d(
        f"gpt:layers={cfg.layers},hidden={cfg.hidden},heads={cfg.heads},seq={cfg.seq},"
        f"vocab={cfg.vocab},dropout=1",
        "a100-80g",
        tp=tp,
        pp=pp,
        dp=dp,
        micro_batch=mb,
        batch=dp * mb * count,
        settings=TrainingSettings(
            sequence_parallel=True, recompute="selective", fp32_grads=True, zero=int(dist_opt)
        ),
        schedule=f"interleaved:{vpp}" if vpp else "1f1b",
        fit_required=False,
    )
    stage = plan.stage_details[0]
    static = stage.params_bytes + stage.grads_bytes + stage.optimizer_bytes
    assert static == pytest.approx(module.compute_weight_and_optimizer_memory(args), rel=0.01)
    expected = module.compute_activation_memory(args, num_microbatches=count)
    assert stage.activations_bytes == pytest.approx(expected, rel=0.01)
    assert not math.isclose(stage.activations_bytes, 0.0)


def test_the_budget_is_the_device_memory_less_its_reserve(tmp_path):
    """hardware.csv's reserve (CUDA context, NCCL buffers, workspaces) is taken from the device's
    memory for the default budget; --memory gives the budget itself; a reserve that leaves nothing
    is refused naming the field."""
    from planner.cluster.cluster import make_cluster
    from planner.cluster.profiles import MachineProfile, ProfileError, get_profile

    h100 = get_profile("h100-80g")
    assert h100.reserve_bytes == 2e9
    assert make_cluster("8", h100).memory_limit == 78e9
    assert make_cluster("8", h100, memory=80e9).memory_limit == 80e9
    with pytest.raises(ProfileError, match="reserve_bytes"):
        MachineProfile("x", 1e12, 1e9, 1e9, 1e9, 8, reserve_bytes=1e9)


def test_evaluate_prints_and_writes_the_memory_parts_per_stage(tmp_path):
    """torchtitan's Llama 3 70B run (FSDP 32 x TP 8, local batch 16, full checkpointing, sequence
    parallel): each layer keeps its input sequence-sharded (2 s b h / t), 80 layers of one
    micro-batch in flight, the loss's fp32 softmax on the vocabulary shard and its backward
    buffers; the parts add up to the stage's memory and the JSON carries them."""
    import json
    import subprocess

    out = tmp_path / "plan.json"
    done = subprocess.run(
        [sys.executable, "-m", "planner", "evaluate", "--model", "llama3-70b", "--device"]
        + ["h100-80g", "--batch", "512", "--tp", "8", "--dp", "32", "--micro-batch", "16"]
        + ["--zero", "3", "--recompute", "full", "--fp32-grads", "--sequence-parallel"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "(x1; 7.83) +" in done.stdout and "reserve per device" in done.stdout
    stage = json.loads(out.read_text())["stages"][0]
    tokens, h, t, vocab = 16 * 8192, 8192, 8, 128256
    assert stage["inflight_microbatches"] == 1
    # what the loss keeps: the fp32 softmax of its vocabulary shard and the int32 labels
    assert stage["logits_bytes"] == tokens * (vocab / t * 4 + 4)
    # the 80 sharded checkpoints are the bulk of what is kept; the rest is the head's part
    checkpoints = 80 * tokens * h / t * 2
    assert checkpoints < stage["activations_bytes"] < checkpoints + 1.1 * stage["logits_bytes"]
    # the working set is the loss's backward (PyTorch's nll_loss_backward and
    # _log_softmax_backward_data: two more fp32 buffers of the kept size), larger here than one
    # layer's re-run (about 34 s b h / t bytes, 4.2 GiB)
    assert stage["working_bytes"] == pytest.approx(2 * stage["logits_bytes"])
    assert stage["working_bytes"] > 34 * tokens * h / t
    parts = ("params", "grads", "optimizer", "activations", "working", "tied")
    assert sum(stage[f"{p}_bytes"] for p in parts) == pytest.approx(stage["memory_bytes"])
    assert stage["memory_bytes"] < 78e9  # it trained: it fits


def _one_stage(model: str, settings: TrainingSettings, tp: int = 1):
    """One H100 stage of ``tp`` devices, two samples in one micro-batch, costed as given."""
    return api3d.evaluate_3d(
        model,
        "h100-80g",
        tp=tp,
        pp=1,
        dp=1,
        micro_batch=2,
        batch=2,
        settings=settings,
        fit_required=False,
    )


@pytest.mark.parametrize(
    "kernel, tp, buffers",
    [("torch", 2, 2), ("loss-parallel", 2, 3), ("loss-parallel", 1, 2), ("fused", 2, 0)],
)
def test_the_loss_kernel_sets_the_backward_buffers(kernel, tp, buffers):
    """The loss's backward holds buffers the size of its saved fp32 softmax beyond it, as the
    engine's kernel allocates them: PyTorch's nll_loss and log_softmax backward 2
    (aten/src/ATen/native/{LossNLL,SoftMax}.cpp), torchtitan's loss-parallel kernel 3 on
    vocabulary-sharded logits (zeros_like, exp and their sum: torchtitan/components/loss.py) and
    PyTorch's 2 on whole ones, megatron-core's vocabulary-parallel cross-entropy 0 (in place:
    megatron/core/tensor_parallel/cross_entropy.py)."""
    plan = _one_stage(
        "llama:layers=2,hidden=256,heads=4,kv_heads=2,seq=128,vocab=4096",
        TrainingSettings(loss_kernel=kernel),
        tp,
    )
    stage = plan.to_dict()["stages"][0]
    tokens = 2 * 128
    assert stage["logits_bytes"] == tokens * (4096 / tp * 4 + 4)  # softmax shard and labels
    assert stage["working_bytes"] == pytest.approx(buffers * stage["logits_bytes"])


def test_torchtitan_operator_policy_keeps_attention_and_every_other_matmul(a100):
    """torchtitan's SelectiveAC (torchtitan/distributed/activation_checkpoint.py: the default save
    set of compute-intensive ops and the policy that re-runs every second aten.mm of a block):
    a LLaMA layer keeps its input, the q, v, gate and down projections' outputs (matmuls 1, 3, 5
    and 7 of the block) and the attention kernel's output, plus the rope table; by hand, bytes
    2 s b (h + h + kv + h + f + h) + 2 s d. It re-runs the norms, k, o and up projections and
    the elementwise operators; its time lies between no recompute and full recompute."""
    from planner.zoo.llama import LlamaConfig, llama

    cfg = LlamaConfig(layers=1, hidden=1024, heads=8, kv_heads=2, ffn=3584, seq=512, vocab=1000)
    s, b, h, f, d = cfg.seq, 2, cfg.hidden, cfg.ffn, cfg.hidden // cfg.heads
    graph, mesh = llama(cfg, batch=b), parse_mesh("1", a100)
    settings = TrainingSettings(recompute="selective-op")
    infos = operand_infos(graph, settings)
    layer = [op for op in graph.operators if op.layer == 0]
    kept = sum(
        op_cost(op, (None,), mesh, settings, infos[op.name], a100).memory.activations
        for op in layer
    )
    assert kept == 2 * s * b * (4 * h + 2 * d + f) + 2 * s * d
    rerun = {op.name.split(".")[-1] for op in layer if infos[op.name][0].rerun}
    assert rerun == {
        "attn_norm",
        "k_proj",
        "rope_q",
        "rope_k",
        "o_proj",
        "attn_residual",
        "mlp_norm",
        "up_proj",
        "silu",
        "swiglu",
        "mlp_residual",
    }
    model = "llama:layers=2,hidden=1024,heads=8,kv_heads=2,ffn=3584,seq=512,vocab=1000"
    times = [
        _one_stage(model, TrainingSettings(recompute=mode)).pipeline.iteration_time_s
        for mode in ("none", "selective-op", "full")
    ]
    assert times[0] < times[1] < times[2]
