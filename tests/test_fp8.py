"""FP8 GEMMs (``--dtype fp8``): a linear layer's GEMMs at the FP8 tensor peak with Transformer
Engine's casts, hand-computed (planner/cost/compute.py); every other operator as under bf16;
refused, by its field, on a device without FP8 tensor cores; an option with an effect."""

import pytest

from planner.cli import main
from planner.cluster.mesh import parse_mesh
from planner.cluster.profiles import get_profile
from planner.cost.compute import quantisation
from planner.cost.operands import operand_infos
from planner.cost.operators import op_cost
from planner.cost.settings import TrainingSettings
from planner.errors import SettingsError
from planner.ir.ops import GraphBuilder
from planner.zoo import load_model

# h100-80g: FP8 dense peak (datasheet: 3,958 TFLOP/s with sparsity), BF16 peak, GEMM efficiency,
# HBM bandwidth, kernel launch, SMs
FP8_PEAK, BF16_PEAK, GEMM, HBM, LAUNCH, SMS = 1979e12, 989e12, 0.8, 3350e9, 4e-6, 132
BF16, FP8 = TrainingSettings(dtype="bf16"), TrainingSettings(dtype="fp8")


def _layer_matmul(m: int, k: int, n: int):
    """x [m, k] times a parameter w [k, n], inside layer 0 (a linear layer), between two
    elementwise ops outside the layers."""
    gb = GraphBuilder("mm")
    x = gb.op("relu", "in", "bk->bk", [gb.data("x0", (m, k))])
    gb.layer = 0
    y = gb.op("matmul", "mm", "bk,kn->bn", [x, gb.param("w", (k, n))])
    gb.layer = None
    gb.op("gelu", "out", "bn->bn", [y])
    return gb.build()


def _record(graph, name: str, settings: TrainingSettings, device: str = "h100-80g"):
    profile = get_profile(device)
    op = graph.operator(name)
    infos = operand_infos(graph, settings)[name]
    strategy = (None,) * 1
    return op_cost(op, strategy, parse_mesh("8", profile), settings, infos, profile)


def test_an_fp8_linear_is_its_gemms_at_the_fp8_peak_plus_its_casts():
    """4096 x 4096 x 4096 on one H100 (replicated): forward GEMM 2 * 4096^3 FLOPs at
    P8 * 0.8 * q, then one cast-transpose per input (reads 2 B and writes 2 x 1 B an element:
    2 x its bf16 bytes over HBM, a launch each); backward: the two GEMMs at P8, the output
    gradient's cast-transpose. bf16: the same GEMMs at the bf16 peak, no casts."""
    graph = _layer_matmul(4096, 4096, 4096)
    flops, elements = 2 * 4096**3, 4096 * 4096
    q = quantisation(4096, 4096, 4096, 1, SMS)  # 1,024 tiles in 8 waves of 132
    assert q == pytest.approx(1024 / (8 * 132))
    in_bytes, out_bytes = 2 * elements * 2, elements * 2  # x and w; y, all bf16
    gemm8, gemm16 = flops / (FP8_PEAK * GEMM * q), flops / (BF16_PEAK * GEMM * q)
    assert gemm8 > (in_bytes + out_bytes) / HBM  # compute-bound at either peak
    fp8, bf16 = _record(graph, "mm", FP8), _record(graph, "mm", BF16)
    assert fp8.fwd_s == pytest.approx(gemm8 + LAUNCH + 2 * in_bytes / HBM + 2 * LAUNCH)
    assert fp8.bwd_s == pytest.approx(2 * gemm8 + 2 * LAUNCH + 2 * out_bytes / HBM + LAUNCH)
    assert bf16.fwd_s == pytest.approx(gemm16 + LAUNCH)
    assert bf16.bwd_s == pytest.approx(2 * gemm16 + 2 * LAUNCH)
    # the step's memory and FLOPs are the bf16 step's: fp8 keeps bf16 tensors
    assert fp8.memory == bf16.memory and (fp8.fwd_flops, fp8.bwd_flops) == (
        bf16.fwd_flops,
        bf16.bwd_flops,
    )
    # a small GEMM loses: its casts cost more than the faster GEMM saves
    small = _layer_matmul(256, 256, 256)
    assert _record(small, "mm", FP8).fwd_s > _record(small, "mm", BF16).fwd_s


def test_only_the_layers_linear_operators_run_in_fp8():
    """In a GPT layer: q, k, v, proj, fc1, fc2 change; the attention's batched matmuls (no
    parameter), norms, elementwise ops, the embedding and the head outside the layers do not."""
    graph = load_model("gpt:layers=1,hidden=1024,heads=8,seq=512,vocab=4096", batch=8)
    changed = {
        op.name
        for op in graph.operators
        if _record(graph, op.name, FP8).fwd_s != _record(graph, op.name, BF16).fwd_s
    }
    linears = {f"h0.attn.{p}" for p in "qkv"} | {"h0.attn.proj", "h0.mlp.fc1", "h0.mlp.fc2"}
    assert changed == linears
    assert {"h0.attn.scores", "lm_head", "embed"} <= {op.name for op in graph.operators}


def test_fp8_is_refused_by_its_field_where_the_device_has_no_fp8_tensor_cores(capsys):
    graph = _layer_matmul(256, 256, 256)
    with pytest.raises(SettingsError, match="^dtype: fp8 needs FP8 tensor cores, and device a100"):
        _record(graph, "mm", FP8, "a100-80g")
    argv = ["plan", "--model", "gpt2-small", "--mesh", "8", "--device", "a100-80g"]
    assert main([*argv, "--dtype", "fp8", "-q"]) == 2
    assert capsys.readouterr().err.startswith("planner: error: --dtype: fp8 needs FP8 tensor")


def test_dtype_fp8_speeds_up_a_large_model_on_h100(tmp_path):
    """The option's effect: Llama 3 8B FSDP on 8 H100 (batch 16 of 8,192 tokens) costs less under
    fp8, with the same memory."""
    import json

    argv = ["evaluate", "--model", "llama3-8b", "--device", "h100-80g", "--batch", "16"]
    argv += ["--seq", "8192", "--tp", "1", "--pp", "1", "--dp", "8", "--micro-batch", "2"]
    argv += ["--zero", "3", "--memory", "200e9", "-q"]
    found = {}
    for dtype in ("bf16", "fp8"):
        out = tmp_path / f"{dtype}.json"
        assert main([*argv, "--dtype", dtype, "--json", str(out)]) == 0
        found[dtype] = json.loads(out.read_text())
    time = {d: found[d]["iteration_time_s"] for d in found}
    memory = {d: found[d]["max_memory_bytes"] for d in found}
    assert time["fp8"] < 0.85 * time["bf16"] and memory["fp8"] == memory["bf16"]


MEGATRON = (
    "torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 512 "
    "--num-attention-heads 8 --seq-length 256 --max-position-embeddings 256 --vocab-size 1024 "
    "--tensor-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 16 --bf16"
)


def test_megatron_fp8_lines_read_as_fp8_and_unpriced_recipes_are_refused():
    """``--fp8-format`` beside ``--bf16`` reads as dtype fp8 (its scaling bookkeeping flags are
    inert); per-block recipes, FP8 parameter gathers and FP8 without bf16 are refused by name."""
    from planner.launch.megatron_read import read_megatron

    assert read_megatron(MEGATRON)[0].settings.dtype == "bf16"
    scaling = " --fp8-amax-history-len 1024 --fp8-amax-compute-algo max --fp8-margin 0"
    for fp8 in (" --fp8-format hybrid", " --fp8-format e4m3 --fp8-recipe tensorwise"):
        run, ignored = read_megatron(MEGATRON + fp8 + scaling)
        assert run.settings.dtype == "fp8" and run.settings.fp32_grads
    refused = {
        " --fp8-format hybrid --fp8-recipe mxfp8": "^--fp8-recipe: 'mxfp8' scales per block",
        " --fp8-format hybrid --fp8-param-gather": "^--from-megatron: --fp8-param-gather is not",
        " --fp8-format e5m2": "^--fp8-format: 'e5m2' is not one of Megatron-LM's",
    }
    for extra, message in refused.items():
        with pytest.raises(SettingsError, match=message):
            read_megatron(MEGATRON + extra)
    with pytest.raises(SettingsError, match="^--fp8-format: FP8 is priced beside --bf16"):
        read_megatron(MEGATRON.replace("--bf16", "--fp16") + " --fp8-format hybrid")


def test_a_megatron_fp8_line_costs_as_evaluate_dtype_fp8(tmp_path):
    """The same configuration through `--from-megatron` and through `evaluate --dtype fp8` with
    the model and settings the line reads as (Megatron-LM's defaults: its fused loss, buckets)."""
    import json

    line = tmp_path / "fp8.sh"
    line.write_text(MEGATRON + " --fp8-format hybrid")
    base = ["evaluate", "--device", "h100-80g", "-q", "--json"]
    assert main([*base, str(tmp_path / "a.json"), "--from-megatron", str(line)]) == 0
    read = json.loads((tmp_path / "a.json").read_text())
    settings = read["settings"]
    assert settings["dtype"] == "fp8" and settings["fp32_grads"]
    given = ["--model", read["source"]["model"], "--batch", "16", "--tp", "2", "--pp", "1"]
    given += ["--dp", "4", "--micro-batch", "1", "--fp32-grads", "--dtype", "fp8"]
    given += ["--overlap", settings["overlap"], "--loss-kernel", settings["loss_kernel"]]
    given += ["--bucket-mb", str(settings["bucket_mb"])]
    assert main([*base, str(tmp_path / "b.json"), *given]) == 0
    again = json.loads((tmp_path / "b.json").read_text())
    assert again["settings"] == settings
    assert read["iteration_time_s"] == pytest.approx(again["iteration_time_s"], rel=1e-9)
    bf16 = tmp_path / "bf16.sh"
    bf16.write_text(MEGATRON)
    assert main([*base, str(tmp_path / "c.json"), "--from-megatron", str(bf16)]) == 0
    slower = json.loads((tmp_path / "c.json").read_text())["iteration_time_s"]
    assert slower != read["iteration_time_s"]
