"""torchtitan 0.3 configurations for a 3D plan of a LLaMA 3 model, and a torchtitan config read
back.

torchtitan 0.3 reads no TOML: a config is a Python ``config_registry`` function returning a
``Trainer.Config``, chosen with ``--module M --config NAME``. The export writes such a file: it
starts from torchtitan's own registry config of the model's flavor (``llama3_8b``, ``llama3_70b``,
``llama3_405b``: model, optimizer and data as torchtitan ships them) and sets (keys of
torchtitan/config/configs.py):

    parallelism.tensor_parallel_degree        t (the stage-mesh axis the linears split)
    parallelism.enable_sequence_parallel      the plan's sequence_parallel
    parallelism.pipeline_parallel_degree      p;  ..._schedule  GPipe | 1F1B | Interleaved1F1B
    parallelism.module_fqns_per_model_part    the cuts: tok_embeddings, layers.i, norm, lm_head
                                              (p x v parts for interleaved:v, round-robin)
    parallelism.pipeline_parallel_microbatch_size   the plan's micro-batch / dp
    parallelism.data_parallel_shard_degree    dp under ZeRO-2/3 (FSDP2), with
    parallelism.fsdp_reshard_after_forward    'always' (ZeRO-3: gathered again in backward) or
                                              'never' (ZeRO-2: kept from forward to backward);
                                              beside pipelining, ZeRO-1 (torch's stages keep
                                              the gathered weights and whole fp32 gradients
                                              to the last backward), 'never'
    parallelism.data_parallel_replicate_degree  dp under ZeRO-0 (DDP: torchtitan runs it on a 1-D
                                              mesh only, no tensor or pipeline parallelism)
    training.local_batch_size / global_batch_size / seq_len
    activation_checkpoint                     none, SelectiveAC (recompute selective-op: its
                                              operator policy) or FullAC (recompute full)

torchtitan keeps fp32 master weights and reduces gradients in fp32 under bf16 mixed precision
(``mixed_precision_param`` bfloat16, ``mixed_precision_reduce`` float32): a plan exports when its
settings say so (dtype bf16 with fp32 gradients). Refused, with the field: models other than
torchtitan's LLaMA 3 flavors, ZeRO-1 without pipelining (torchtitan has none), selective
recompute (torchtitan's selective AC is the operator policy, ``selective-op``, not Korthikanti's
attention-core recompute), per-layer choices, DDP beside tensor or pipeline parallelism, and
ZeRO-2/3 beside pipelining (torch's stages run FSDP2 as ZeRO-1 there:
launch.torchtitan_read._zero).
"""

from __future__ import annotations

from planner.launch.run import LaunchRun
from planner.errors import SettingsError
from planner.zoo import LLAMA_PRESETS, LlamaConfig

# the planner's LLaMA 3 presets and torchtitan's registry functions of the same flavor
FLAVORS = {"llama3-8b": "llama3_8b", "llama3-70b": "llama3_70b", "llama3-405b": "llama3_405b"}
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B"}
CONFIG_NAME = "planner_plan"


def flavor(cfg) -> str:
    """torchtitan's registry function for the model (SettingsError when it has none)."""
    for name, function in FLAVORS.items():
        preset = LLAMA_PRESETS[name]
        if isinstance(cfg, LlamaConfig) and _same_model(cfg, preset):
            return function
    raise SettingsError(
        "--target torchtitan: torchtitan's llama3 registry has the LLaMA 3 8B, 70B and 405B "
        "flavors; the plan's model is none of them (attention fused, any sequence length)"
    )


def _same_model(cfg: LlamaConfig, preset: LlamaConfig) -> bool:
    fields = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts", "attention")
    return all(getattr(cfg, name) == getattr(preset, name) for name in fields)


def check_expressible(run: LaunchRun) -> None:
    """SettingsError naming the setting torchtitan cannot run as the plan costs it."""
    s = run.settings
    if s.zero == 1 and run.pipeline_parallel == 1:
        raise SettingsError(
            "--target torchtitan: torchtitan has no ZeRO-1 without pipeline parallelism (plan "
            "with --zero 2 or 3)"
        )
    if s.layer_recompute:
        raise SettingsError(
            "--target torchtitan: torchtitan checkpoints every layer alike (or every n-th: not "
            "Megatron-LM's block recompute); plan with one --recompute mode"
        )
    if s.recompute == "selective":
        raise SettingsError(
            "--target torchtitan: torchtitan's selective activation checkpointing is an operator "
            "policy, not the attention-core recompute the plan costs (plan with --recompute "
            "selective-op, none or full)"
        )
    if s.zero == 0 and run.data_parallel > 1 and run.world_size > run.data_parallel:
        raise SettingsError(
            "--target torchtitan: torchtitan runs data parallelism beside tensor or pipeline "
            "parallelism through FSDP only (plan with --zero 2 or 3, or 1 beside a pipeline)"
        )
    if s.dtype != "bf16" or not s.fp32_grads:
        raise SettingsError(
            "--target torchtitan: torchtitan trains in bf16 mixed precision with fp32 master "
            "weights and fp32 gradient reduction (plan with --dtype bf16 --fp32-grads)"
        )
    # on whole (tp 1) logits its kernel is PyTorch's: torch and loss-parallel cost the same
    if s.loss_kernel == "fused" or (s.loss_kernel == "torch" and run.tensor_parallel > 1):
        raise SettingsError(
            f"--target torchtitan: torchtitan's loss is its loss-parallel kernel, not the plan's "
            f"{s.loss_kernel!r} (plan with --loss-kernel loss-parallel)"
        )
    if s.zero >= 2 and run.pipeline_parallel > 1 and run.data_parallel > 1:
        raise SettingsError(
            f"--target torchtitan: ZeRO-{s.zero} beside pipeline parallelism is not what torch "
            "runs: its pipeline stages keep FSDP's gathered weights and whole fp32 gradients "
            "until the last micro-batch's backward (plan with --zero 1, which prices that)"
        )


def model_parts(run: LaunchRun) -> list[list[str]]:
    """``module_fqns_per_model_part``: the stages' modules (p x v parts, round-robin per rank
    under interleaved:v)."""
    layers, parts = run.model.layers, run.pipeline_parallel * run.virtual_stages
    if run.virtual_stages > 1 or run.cuts is None:
        if layers % parts:
            raise SettingsError(
                f"--target torchtitan: {layers} layers do not split evenly into {parts} parts"
            )
        bounds = [k * layers // parts for k in range(parts + 1)]
    else:
        bounds = [0, *run.cuts, layers]
    out = [[f"layers.{i}" for i in range(a, b)] for a, b in zip(bounds, bounds[1:])]
    out[0].insert(0, "tok_embeddings")
    out[-1] += ["norm", "lm_head"]
    return out


def config_file(run: LaunchRun, title: str) -> str:
    """A torchtitan ``config_registry`` module whose ``planner_plan()`` is the run."""
    check_expressible(run)
    lines = [
        f'"""torchtitan 0.3 configuration written by `planner export --target torchtitan`: '
        f"{title}.",
        "",
        "Run: torchrun --nnodes N --nproc-per-node G -m torchtitan.train --module MODULE "
        f"--config {CONFIG_NAME}",
        f'(N x G = {run.world_size} GPUs; MODULE: this file\'s name, importable)."""',
        "",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        "from torchtitan.models.llama3 import config_registry",
        "",
        "",
        f"def {CONFIG_NAME}():",
        f"    config = config_registry.{flavor(run.model)}()",
    ]
    return "\n".join(
        lines + _parallel_lines(run) + _training_lines(run) + ["    return config", ""]
    )


def _parallel_lines(run: LaunchRun) -> list[str]:
    s, dp = run.settings, run.data_parallel
    # ZeRO-1 beside pipelining is FSDP2 under torch's pipeline stages (launch.torchtitan_read)
    shard = dp if s.zero >= 1 else 1
    lines = [
        "    p = config.parallelism",
        f"    p.tensor_parallel_degree = {run.tensor_parallel}",
        f"    p.enable_sequence_parallel = {bool(s.sequence_parallel and run.tensor_parallel > 1)}",
        f"    p.data_parallel_shard_degree = {shard}",
        f"    p.data_parallel_replicate_degree = {dp // shard}",
        f'    p.fsdp_reshard_after_forward = "{"always" if s.zero == 3 else "never"}"',
        f"    p.pipeline_parallel_degree = {run.pipeline_parallel}",
    ]
    if run.pipeline_parallel > 1:
        schedule = "Interleaved1F1B" if run.virtual_stages > 1 else SCHEDULES[run.schedule]
        lines += [
            f'    p.pipeline_parallel_schedule = "{schedule}"',
            f"    p.pipeline_parallel_microbatch_size = {run.micro_batch}",
            f"    p.module_fqns_per_model_part = {model_parts(run)!r}",
        ]
    return lines


def _training_lines(run: LaunchRun) -> list[str]:
    """The batch: with a pipeline the local batch is every micro-batch of a step; without one it
    is one micro-batch and the rest is gradient accumulation (global > local x dp)."""
    steps = run.global_batch // (run.micro_batch * run.data_parallel)
    local = run.micro_batch * (steps if run.pipeline_parallel > 1 else 1)
    ac = {"full": "FullAC.Config()", "selective-op": "SelectiveAC.Config()"}.get(
        run.settings.recompute, "None"
    )
    return [
        f"    config.training.local_batch_size = {local}",
        f"    config.training.global_batch_size = {run.global_batch}",
        f"    config.training.seq_len = {run.model.seq}",
        '    config.training.mixed_precision_param = "bfloat16"',
        '    config.training.mixed_precision_reduce = "float32"',
        f"    config.activation_checkpoint = {ac}",
    ] + (
        # torchtitan's validation: CUDA graphs do not support pipeline parallelism
        ["    config.training.disable_cuda_graphs = True"] if run.pipeline_parallel > 1 else []
    )
