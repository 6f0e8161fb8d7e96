"""Megatron-LM lines as their authors wrote them: older recompute flags read as today's, parallel
degrees of 1 accepted, the virtual-stage size converted, fp16 gradient buffers, and every flag
either priced, refused by name, or on the list of flags proven inert
(planner/launch/megatron_flags.py)."""

from __future__ import annotations

import pytest

from planner.launch.megatron_flags import INERT, LEGACY
from planner.launch.megatron_read import read_megatron
from planner.errors import SettingsError

BASE = (
    "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 8 --hidden-size 512 "
    "--num-attention-heads 8 --seq-length 256 --vocab-size 1024 --micro-batch-size 1 "
    "--global-batch-size 16 "
)


@pytest.mark.parametrize(
    "flags, recompute",
    [
        # Megatron-LM 2021 (the SC'21 scripts): full recompute of every layer
        ("--checkpoint-activations", "full"),
        ("--checkpoint-activations --checkpoint-num-layers 1", "full"),
        (
            "--checkpoint-activations --activations-checkpoint-method uniform "
            "--activations-checkpoint-num-layers 1",
            "full",
        ),
        # Megatron-LM 2022 (Korthikanti et al.): selective recompute
        ("--recompute-activations", "selective"),
        ("--recompute-granularity full --recompute-method uniform", "full"),
    ],
)
def test_older_recompute_flags_are_read_as_todays(flags, recompute):
    run, ignored = read_megatron(BASE + "--bf16 " + flags)
    assert run.settings.recompute == recompute and ignored == ()


def test_parallel_degrees_of_one_are_accepted_and_larger_ones_refused():
    run, _ = read_megatron(BASE + "--context-parallel-size 1 --expert-model-parallel-size 1")
    assert run.data_parallel == 8
    for flag in ("--context-parallel-size", "--expert-model-parallel-size"):
        with pytest.raises(SettingsError, match=f"{flag} 2 is not modelled"):
            read_megatron(BASE + f"{flag} 2")


def test_layers_per_virtual_stage_convert_to_virtual_stages():
    """Megatron-LM: virtual stages = layers / pp / --num-layers-per-virtual-pipeline-stage."""
    run, _ = read_megatron(
        BASE + "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2"
    )
    assert run.schedule == "interleaved:2"
    with pytest.raises(SettingsError, match="--num-layers-per-virtual-pipeline-stage"):
        read_megatron(
            BASE + "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3"
        )


def test_fp16_keeps_fp16_gradient_buffers_unless_told():
    """arguments.py turns accumulate_allreduce_grads_in_fp32 on for bf16 only."""
    assert not read_megatron(BASE + "--fp16")[0].settings.fp32_grads
    told = read_megatron(BASE + "--fp16 --accumulate-allreduce-grads-in-fp32")[0]
    assert told.settings.fp32_grads and told.settings.dtype == "fp16"
    assert read_megatron(BASE + "--bf16")[0].settings.fp32_grads
    assert not read_megatron(BASE + "--bf16 --grad-reduce-in-bf16")[0].settings.fp32_grads


@pytest.mark.parametrize(
    "flag", ["--tensor-model-parallel-sizes 8", "--use-flash-attn", "--no-masked-softmax-fusion"]
)
def test_a_flag_that_is_neither_priced_nor_inert_is_refused_by_name(flag):
    with pytest.raises(SettingsError, match=flag.split()[0]):
        read_megatron(BASE + flag)


def test_inert_flags_are_listed_as_ignored():
    run, ignored = read_megatron(
        BASE + "--lr 3e-4 --data-path /d --split 949,50,1 --log-interval 10 --seed 7 "
        "--weight-decay=0.1"
    )
    assert ignored == (
        "--lr",
        "--data-path",
        "--split",
        "--log-interval",
        "--seed",
        "--weight-decay",
    )
    assert set(ignored) <= INERT and not set(LEGACY) & INERT


NO_VOCAB = BASE.replace("--vocab-size 1024 ", "")


@pytest.mark.parametrize(
    "flags, vocab",
    [
        ("", 50304),  # no tokenizer given: GPT-2's 50,257, padded to 128
        ("--tokenizer-type GPT2BPETokenizer --vocab-file v.json --merge-file m.txt", 50304),
        ("--tokenizer-type Llama2Tokenizer --tokenizer-model /t/tokenizer.model", 32000),
        ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Llama-3.1-8B", 128256),
        ("--tokenizer-type NullTokenizer --vocab-size 1000", 1024),
    ],
)
def test_the_vocabulary_comes_from_the_tokenizer(flags, vocab):
    run, _ = read_megatron(NO_VOCAB + flags)
    assert run.model.vocab == vocab


@pytest.mark.parametrize(
    "flags",
    ["--tokenizer-type NullTokenizer", "--tokenizer-type HuggingFaceTokenizer --tokenizer-model x"],
)
def test_an_unknown_vocabulary_is_refused(flags):
    with pytest.raises(SettingsError, match="--vocab-size: give it"):
        read_megatron(NO_VOCAB + flags)


def test_dp_that_contradicts_the_launcher_is_refused():
    """Was: --dp silently overrode torchrun's world size."""
    assert read_megatron(BASE, dp=8)[0].data_parallel == 8  # agrees: 8 GPUs, tp 1, pp 1
    with pytest.raises(SettingsError, match="--dp: 4 x tp 1 x pp 1 is not the launcher's world"):
        read_megatron(BASE, dp=4)


@pytest.mark.parametrize(
    "flags, message",
    [
        ("--recompute-granularity Full", "'Full' is not one of Megatron-LM's"),
        ("--use-megatron-fsdp --data-parallel-sharding-strategy zero3", "'zero3' is not one of"),
        ("--pipeline-model-parallel-size 3", "--num-layers: 8 is not divisible"),
    ],
)
def test_values_megatron_refuses_are_refused(flags, message):
    """Was: Full costed as no recompute, an unknown sharding strategy as ZeRO-3, 8 layers on 3
    stages accepted (Megatron-LM asserts)."""
    # 24 GPUs for the 3-stage line (dp 8 divides the batch), 8 otherwise
    base = (
        BASE.replace("--nproc-per-node 8", "--nproc-per-node 24") if "--pipeline" in flags else BASE
    )
    with pytest.raises(SettingsError, match=message):
        read_megatron(base + flags)


def test_megatron_defaults_where_a_line_leaves_a_flag_out():
    """No --ffn-hidden-size beside --swiglu: Megatron-LM's int(4h x 2/3 / 64) x 64; GQA without
    --num-query-groups: one group; no_shard is ZeRO 0."""
    llama = (
        BASE + "--swiglu --normalization RMSNorm --position-embedding-type rope "
        "--disable-bias-linear --group-query-attention"
    )
    run, _ = read_megatron(llama)
    assert run.model.ffn == int(4 * 512 * 2 / 3 / 64) * 64 == 1344
    assert run.model.kv_heads == 1
    fsdp = read_megatron(BASE + "--use-megatron-fsdp --data-parallel-sharding-strategy no_shard")
    assert fsdp[0].settings.zero == 0


def test_launch_files_are_read_bounded_and_as_utf8(tmp_path, capsys):
    from planner.cli.main import main

    big = tmp_path / "big.sh"
    big.write_bytes(b"#" * (1 << 20) + b"\n")
    assert main(["evaluate", "--from-megatron", str(big)]) == 2
    assert "larger than 1 MiB" in capsys.readouterr().err
    binary = tmp_path / "bin.sh"
    binary.write_bytes(b"torchrun \xff\xfe pretrain_gpt.py")
    assert main(["evaluate", "--from-megatron", str(binary)]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, attention",
    [
        ("", "fused"),
        ("--attention-backend flash", "fused"),
        ("--attention-backend unfused", "explicit"),
    ],
)
def test_a_gpt_line_attends_as_its_backend_runs(flags, attention):
    """Megatron-LM's default backend (auto) runs a fused attention kernel: a GPT line is costed
    with it unless it asks for the unfused (or local) one."""
    run, _ = read_megatron(f"{BASE} {flags}")
    assert run.model.attention == attention
    assert ("attention=fused" in run.model_spec) == (attention == "fused")


def test_fused_attention_keeps_no_attention_core():
    """Korthikanti et al. (2022), Table 2: the attention core keeps 5 a s^2 b bytes a layer (the
    softmax output, its dropout mask and output); a fused kernel (FlashAttention) keeps none of
    them: a GPT with fused attention saves exactly that much less, layer by layer."""
    from planner import api

    s, b, a, layers = 256, 2, 8, 2
    saved = {}
    for form in ("explicit", "fused"):
        spec = f"gpt:layers={layers},hidden=512,heads={a},seq={s},vocab=1024,dropout=1"
        spec += f",attention={form}"
        graph = api.resolve_model(spec, b, None)
        plan = api.evaluate(spec, "1", assignment={op.name: {} for op in graph.operators}, batch=b)
        saved[form] = dict(plan.memory_breakdown)["activations"]
    assert saved["explicit"] - saved["fused"] == 5 * a * s * s * b * layers


BLOCK = BASE.replace("--nproc-per-node 8", "--nproc-per-node 8 --nnodes 1") + (
    "--bf16 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
    "--recompute-granularity full --recompute-method block "
)


def test_block_recompute_reads_as_the_first_layers_of_each_chunk():
    """--recompute-method block --recompute-num-layers N: each model chunk (here 8 layers over pp 2
    and 2 virtual stages: chunks of 2) re-runs its first N layers in full (megatron-core's
    recompute.py, checkpointed_forward), read as per-layer modes."""
    run, ignored = read_megatron(BLOCK + "--recompute-num-layers 1")
    assert ignored == () and run.settings.recompute == "auto"
    assert run.settings.layer_recompute == tuple(
        (layer, "full" if layer % 2 == 0 else "none") for layer in range(8)
    )
    # a count past the chunk re-runs every layer of it; none at all is refused, as Megatron-LM's
    # TransformerConfig does
    assert all(
        mode == "full"
        for _, mode in read_megatron(BLOCK + "--recompute-num-layers 3")[0].settings.layer_recompute
    )
    with pytest.raises(SettingsError, match="--recompute-num-layers: full recompute needs it"):
        read_megatron(BLOCK)
    with pytest.raises(SettingsError, match="--recompute-method: full recompute is read as"):
        read_megatron(BLOCK.replace("block", "uniform") + "--recompute-num-layers 2")


def test_block_recompute_costs_between_none_and_full_and_round_trips():
    """Half the layers re-run: the step time and memory lie strictly between no recompute and full;
    the whole chunk re-run is full recompute exactly; the plan exports as the same block line."""
    from planner.launch import export_megatron, plan_data, recost

    def costed(flags: str):
        plan = recost(read_megatron(flags)[0], "h100-80g")
        return plan.pipeline.iteration_time_s, plan.pipeline.max_memory_bytes, plan

    none = costed(BLOCK.split(" --recompute-granularity")[0])
    full = costed(BLOCK.replace("block", "uniform") + "--recompute-num-layers 1")
    half = costed(BLOCK + "--recompute-num-layers 1")
    whole = costed(BLOCK + "--recompute-num-layers 2")
    assert none[0] < half[0] < full[0] and full[1] < half[1] < none[1]
    assert whole[:2] == pytest.approx(full[:2], rel=1e-12)
    spec = read_megatron(BLOCK + "--recompute-num-layers 1")[0].model_spec
    exported = export_megatron(plan_data(half[2], spec, None))
    assert "--recompute-method block --recompute-num-layers 1" in exported.text


@pytest.mark.parametrize(
    "flags, message",
    [
        # was: "--model: parameter 'layers' is at most 4096" (an option the user never gave)
        ("--num-layers 1000000", "--from-megatron: --num-layers: at most 4096"),
        # was: "--model: field 'heads' (3) must divide hidden (512)"
        ("--num-attention-heads 3", "--from-megatron: --num-attention-heads: field 'heads'"),
        # was: accepted, an iteration of 10^12 s costed for 10^17 sequences
        ("--global-batch-size 100000000000000000", "--global-batch-size: needs a positive integer"),
        ("--hidden-size " + "9" * 5000, r"--hidden-size: needs a positive integer below 2\^40"),
    ],
)
def test_a_line_out_of_range_is_refused_by_its_own_flag(flags, message):
    with pytest.raises(SettingsError, match=message):
        read_megatron(BASE + "--bf16 " + flags)


def test_kv_channels_at_megatrons_default_is_read_and_another_head_size_refused():
    """``--kv-channels`` (the attention head size) defaults to hidden / heads in Megatron-LM's
    arguments.py; real scripts spell the default out (LLaMA: 128). Was refused as unknown."""
    plain, _ = read_megatron(BASE + "--bf16")
    spelled, ignored = read_megatron(BASE + "--bf16 --kv-channels 64")  # 512 / 8
    assert spelled == plain and ignored == ()
    with pytest.raises(SettingsError, match="--kv-channels 32: a head size other than"):
        read_megatron(BASE + "--bf16 --kv-channels 32")


@pytest.mark.parametrize("script", ["pretrain_bert.py", "pretrain_t5.py", "pretrain_mamba.py"])
def test_a_line_that_trains_another_architecture_is_refused_by_its_script(script):
    """Was: a BERT or T5 line was costed as the GPT decoder its flags describe, without a word."""
    with pytest.raises(SettingsError, match=f"{script} trains another model"):
        read_megatron(BASE.replace("pretrain_gpt.py", script) + "--bf16")
    assert read_megatron(BASE.replace("pretrain_gpt.py", "megatron/pretrain_gpt2.py"))[0]
