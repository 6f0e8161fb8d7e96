"""A Megatron-LM command line read back into a ``LaunchRun`` (``planner evaluate
--from-megatron``): the inverse of ``planner.launch.megatron``'s mapping, with Megatron-LM's own
defaults (megatron-core 0.19 ``megatron/training/arguments.py``) for the flags a line leaves out.

A line may start with environment assignments and a ``torchrun`` launch (its ``--nnodes`` and
``--nproc-per-node`` give the world size); the Megatron arguments follow the script. Flags that
change the run in a way the cost model does not price (``megatron.UNSUPPORTED``, or a parallel
degree above 1 for context and expert parallelism) are refused; flags proven not to change a
step (``megatron_flags.INERT``: learning rate, data paths, logging) are listed as ignored; any
other flag is refused with its name. Older spellings (``--checkpoint-activations``) are read as
today's (``megatron_flags.LEGACY``).
"""

from __future__ import annotations

import argparse
import re
import shlex

from dataclasses import replace

from planner.cost.settings import AUTO, TrainingSettings
from planner.launch.run import LaunchRun
from planner.launch.megatron import UNSUPPORTED, block_modes, layout_cuts
from planner.launch.megatron_flags import DEEPSPEED, modern_words, split_unknown
from planner.launch.shell_script import launch_text, unset_variable, without_comments
from planner.launch.megatron_model import line_model
from planner.errors import SettingsError
from planner.units import MAX_COUNT

_INT_FLAGS = (
    ("num_layers", None),
    ("hidden_size", None),
    ("num_attention_heads", None),
    ("ffn_hidden_size", None),
    ("seq_length", None),
    ("vocab_size", None),
    ("make_vocab_size_divisible_by", 128),
    ("num_query_groups", None),
    ("tensor_model_parallel_size", 1),
    ("pipeline_model_parallel_size", 1),
    ("num_virtual_stages_per_pipeline_rank", None),
    ("micro_batch_size", None),
    ("global_batch_size", None),
    ("recompute_num_layers", None),
    ("ddp_bucket_size", None),
    ("max_position_embeddings", None),  # read, no effect: positions are seq-length's
    ("context_parallel_size", 1),  # 1 only: context parallelism is not modelled
    ("expert_model_parallel_size", 1),  # 1 only: no experts
    ("num_layers_per_virtual_pipeline_stage", None),
    ("kv_channels", None),  # hidden / heads only (Megatron-LM's default): other head sizes refused
)
_SWITCHES = (
    "swiglu",
    "group_query_attention",
    "disable_bias_linear",
    "untie_embeddings_and_output_weights",
    "sequence_parallel",
    "use_distributed_optimizer",
    "use_megatron_fsdp",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "bf16",
    "fp16",
    "grad_reduce_in_bf16",
    "accumulate_allreduce_grads_in_fp32",
)
_TEXT_FLAGS = (
    ("normalization", "LayerNorm"),
    ("position_embedding_type", "learned_absolute"),
    ("attention_backend", "auto"),
    ("recompute_granularity", None),
    ("recompute_method", None),
    ("data_parallel_sharding_strategy", "optim_grads_params"),
    ("optimizer", "adam"),
    ("pipeline_model_parallel_layout", None),
    ("tokenizer_type", None),  # the vocabulary where --vocab-size is not given
    ("tokenizer_model", None),
    ("ckpt_format", None),  # read, no effect on a step
    ("fp8_format", None),  # e4m3 or hybrid: the linear layers' GEMMs in FP8 (dtype fp8)
    ("fp8_recipe", "delayed"),  # per-tensor scales (delayed, tensorwise) are priced
)


_FLOAT_FLAGS = (("attention_dropout", 0.1), ("hidden_dropout", 0.1))


def _positive(text: str) -> int:
    variable = unset_variable(text)
    if variable:
        raise argparse.ArgumentTypeError(
            f"set {variable} in the script (it is read from the environment)"
        )
    # the command line's bound on a count (--batch, --seq): past it no cost is meaningful
    if not text.isdigit() or len(text) > 13 or not 1 <= int(text) < MAX_COUNT:
        shown = text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"needs a positive integer below 2^40, got {shown!r}")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="--from-megatron", add_help=False, allow_abbrev=False, exit_on_error=False
    )
    for name, default in _INT_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), type=_positive, default=default)
    for name, default in _FLOAT_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), type=float, default=default)
    for name in _SWITCHES:
        p.add_argument("--" + name.replace("_", "-"), action="store_true")
    for name, default in _TEXT_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), default=default)
    return p


def _parse(parser: argparse.ArgumentParser, words: list[str]):
    """``parse_known_args``, a bad value refused in one line naming its flag."""
    try:
        return parser.parse_known_args(words)
    except argparse.ArgumentError as exc:
        raise SettingsError(f"--from-megatron: {exc}") from None


def split_launch(text: str) -> tuple[int | None, list[str]]:
    """(the launcher's world size or None, the Megatron arguments) of a launch script, line or
    argument file (``#`` comments and line breaks allowed; a script's variables expanded:
    ``shell_script.launch_text``). The world size is torchrun's (also ``python -m
    torch.distributed.run`` / ``launch``) ``--nnodes x --nproc-per-node`` or DeepSpeed's
    ``--num_nodes x --num_gpus``; None for other launchers (srun, python)."""
    text = without_comments(launch_text(text))
    try:
        words = shlex.split(text)
    except ValueError as exc:  # an unclosed quote
        raise SettingsError(f"--from-megatron: cannot split the line: {exc}") from None
    while words and "=" in words[0] and not words[0].startswith("-"):
        words.pop(0)  # environment assignments
    script = next((k for k, w in enumerate(words) if w.endswith(".py")), None)
    if script is None:
        if words and words[0].endswith("torchrun"):
            raise SettingsError("--from-megatron: a torchrun line names no training script (.py)")
        return None, words
    name = words[script].rsplit("/", 1)[-1]
    if name not in GPT_SCRIPTS:
        raise SettingsError(
            f"--from-megatron: {name} trains another model than the GPT/LLaMA decoders of "
            "pretrain_gpt.py, which the planner reads: not modelled"
        )
    return _world(words[:script]), words[script + 1 :]


# Megatron-LM's decoder training script (pretrain_gpt2.py: its name until 2020); BERT, T5, Mamba,
# retrieval and multimodal models have scripts of their own and are not the zoo's decoders
GPT_SCRIPTS = ("pretrain_gpt.py", "pretrain_gpt2.py")


def _world(launcher: list[str]) -> int | None:
    """The world size a launcher's words start (see ``split_launch``)."""
    torch_run = bool(launcher) and (
        launcher[0].endswith("torchrun")
        or any(w in ("torch.distributed.run", "torch.distributed.launch") for w in launcher)
    )
    deepspeed = bool(launcher) and launcher[0].endswith("deepspeed")
    if not (torch_run or deepspeed):
        return None
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    nodes, gpus = ("--num_nodes", "--num_gpus") if deepspeed else ("--nnodes", "--nproc-per-node")
    for flag, dest in ((nodes, "nodes"), (gpus, "gpus")):
        spellings = {flag, "--" + flag[2:].replace("_", "-"), "--" + flag[2:].replace("-", "_")}
        parser.add_argument(*sorted(spellings), dest=dest, type=_positive, default=1)
    known, _ = _parse(parser, launcher[1:])
    return known.nodes * known.gpus


def _refuse_unmodelled(words: list[str]) -> None:
    """SettingsError naming the first flag of a Megatron-DeepSpeed line or of a feature the cost
    model does not price."""
    deepspeed = [w.split("=")[0] for w in words if w.split("=")[0] in DEEPSPEED]
    if deepspeed:
        raise SettingsError(
            f"--from-megatron: {deepspeed[0]} makes this a Megatron-DeepSpeed line: its ZeRO "
            "stage, pipeline and checkpointing come from DeepSpeed's JSON config, which the "
            "planner does not read (cost it as `planner evaluate --tp --pp --dp --zero`)"
        )
    refused = [w for w in words if w.split("=")[0] in UNSUPPORTED]
    if refused:
        raise SettingsError(
            f"--from-megatron: {refused[0].split('=')[0]} is not modelled yet (context and "
            "expert parallelism, FP8 parameter gathers, offload, recompute modules, first/last-"
            "stage layer counts)"
        )


def read_megatron(text: str, dp: int | None = None) -> tuple[LaunchRun, tuple[str, ...]]:
    """The run a Megatron-LM line describes and the flags it ignored. Its data-parallel degree is
    ``dp`` when given, else torchrun's world size over tensor x pipeline parallel."""
    world, words = split_launch(text)
    words = modern_words(words)
    _refuse_unmodelled(words)
    args, unknown = _parse(_parser(), words)
    flag, ignored = split_unknown(unknown)
    if flag is not None:
        raise SettingsError(
            f"--from-megatron: {flag} is not read by the planner and may change the step: "
            "remove it to cost the line without it (a typo? see Megatron-LM's arguments.py)"
        )
    for name in ("context_parallel_size", "expert_model_parallel_size"):
        if getattr(args, name) != 1:
            raise SettingsError(
                f"--from-megatron: --{name.replace('_', '-')} {getattr(args, name)} is not "
                "modelled yet (only 1)"
            )
    for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length"):
        if getattr(args, name) is None:
            raise SettingsError(f"--from-megatron: --{name.replace('_', '-')} is required")
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if dp is None and world is None:
        raise SettingsError(
            "--dp: give the data-parallel degree (the line has no torchrun launch to count "
            "its devices)"
        )
    if dp is not None and world is not None and world != dp * tp * pp:
        raise SettingsError(
            f"--dp: {dp} x tp {tp} x pp {pp} is not the launcher's world size {world} (leave "
            "--dp out to take the launcher's)"
        )
    if dp is None and world % (tp * pp):
        raise SettingsError(
            f"--from-megatron: the world size {world} is not divisible by tensor x pipeline "
            f"parallel {tp} x {pp}{_node_hint(text)}"
        )
    return _run(args, dp or world // (tp * pp)), ignored


def _node_hint(text: str) -> str:
    """Where a script sets its node count through a variable: set it (or give --dp)."""
    found = re.search(r"--(?:nnodes|num_nodes|num-nodes)[ =]+\$\{?([A-Za-z_]\w*)", text)
    return f": set {found.group(1)} in the script (or give --dp)" if found else ""


def _bucket_bytes(args, dp: int, grad_bytes: int) -> float:
    """Megatron's gradient bucket: --ddp-bucket-size parameters, by default max(40M, 1M x dp)
    (megatron/core/distributed/distributed_data_parallel.py)."""
    elements = args.ddp_bucket_size or max(40_000_000, 1_000_000 * dp)
    return float(elements * grad_bytes)


def _run(args, dp: int) -> LaunchRun:
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    micro = args.micro_batch_size or 1
    batch = args.global_batch_size or micro * dp
    if batch % (micro * dp):
        raise SettingsError(
            f"--global-batch-size: {batch} is not a multiple of micro-batch {micro} x dp {dp}"
        )
    cuts = None
    if args.pipeline_model_parallel_layout:
        cuts = layout_cuts(args.pipeline_model_parallel_layout, pp)
    elif args.num_layers % pp:
        raise SettingsError(
            f"--num-layers: {args.num_layers} is not divisible by --pipeline-model-parallel-size "
            f"{pp} (Megatron-LM asserts it without a --pipeline-model-parallel-layout)"
        )
    return LaunchRun(
        line_model(args, tp),
        tp,
        pp,
        dp,
        micro,
        batch,
        _settings(args, dp),
        _virtual_stages(args),
        cuts,
    )


def _virtual_stages(args) -> int:
    """Megatron-LM's virtual stages per rank: --num-virtual-stages-per-pipeline-rank, or layers /
    pp / --num-layers-per-virtual-pipeline-stage (arguments.py's conversion, which asserts the
    division)."""
    per_stage = args.num_layers_per_virtual_pipeline_stage
    if per_stage is None:
        return args.num_virtual_stages_per_pipeline_rank or 1
    pp = args.pipeline_model_parallel_size
    if args.num_layers % (pp * per_stage):
        raise SettingsError(
            f"--num-layers-per-virtual-pipeline-stage: {per_stage} x pp {pp} does not divide "
            f"--num-layers {args.num_layers}"
        )
    return args.num_layers // pp // per_stage


# values Megatron-LM's parser accepts (arguments.py choices); others are refused, not guessed
CHOICES = {
    "recompute_granularity": (None, "full", "selective"),
    "recompute_method": (None, "uniform", "block"),
    "data_parallel_sharding_strategy": ("no_shard", "optim", "optim_grads", "optim_grads_params"),
    "fp8_format": (None, "e4m3", "hybrid"),
    "fp8_recipe": ("delayed", "tensorwise", "mxfp8", "blockwise", "custom"),
}
# FP8 recipes with one scale per tensor: Transformer Engine's cast-transpose kernels, as priced
PER_TENSOR_FP8 = ("delayed", "tensorwise")


def _check_choices(args) -> None:
    for name, allowed in CHOICES.items():
        value = getattr(args, name)
        if value not in allowed:
            known = ", ".join(a for a in allowed if a)
            raise SettingsError(
                f"--{name.replace('_', '-')}: {value!r} is not one of Megatron-LM's ({known})"
            )


def _block_recompute(args, dp: int) -> TrainingSettings:
    """``--recompute-method block --recompute-num-layers N``: each chunk of L / (pp v) layers
    re-runs its first N (all when N is past it) in full (``megatron.block_modes``)."""
    if args.pipeline_model_parallel_layout:
        raise SettingsError(
            "--recompute-method: block recompute with --pipeline-model-parallel-layout is not "
            "modelled yet (its chunks are uneven)"
        )
    if args.recompute_num_layers is None:  # TransformerConfig refuses it too
        raise SettingsError("--recompute-num-layers: full recompute needs it (1 or more)")
    chunk = args.num_layers // (args.pipeline_model_parallel_size * _virtual_stages(args))
    modes = block_modes(args.num_layers, chunk, min(args.recompute_num_layers, chunk))
    plain = argparse.Namespace(**{**vars(args), "recompute_granularity": None})
    return replace(_settings(plain, dp), recompute=AUTO, layer_recompute=modes)


def _fp8(args, dtype: str) -> str:
    """``fp8`` under ``--fp8-format`` (beside ``--bf16``: bf16 tensors, FP8 GEMMs), else
    ``dtype``; recipes that scale per block (MXFP8, blockwise) are refused."""
    if args.fp8_format is None:
        return dtype
    if dtype != "bf16":
        raise SettingsError(
            "--fp8-format: FP8 is priced beside --bf16 (bf16 tensors kept, the linear layers' "
            f"GEMMs in FP8); this line keeps {dtype}"
        )
    if args.fp8_recipe not in PER_TENSOR_FP8:
        raise SettingsError(
            f"--fp8-recipe: {args.fp8_recipe!r} scales per block, which the planner does not "
            f"price (per-tensor recipes: {', '.join(PER_TENSOR_FP8)})"
        )
    return "fp8"


def _settings(args, dp: int) -> TrainingSettings:
    _check_choices(args)
    recompute = "none"
    if args.recompute_granularity == "selective":
        recompute = "selective"
    elif args.recompute_granularity == "full":
        if args.recompute_method == "block":
            return _block_recompute(args, dp)
        if args.recompute_method != "uniform" or (args.recompute_num_layers or 1) != 1:
            raise SettingsError(
                "--recompute-method: full recompute is read as uniform over 1 layer (each layer's "
                "input kept) or block; uniform over wider chunks is not modelled yet"
            )
        recompute = "full"
    zero = 1 if args.use_distributed_optimizer else 0
    if args.use_megatron_fsdp:
        strategies = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        zero = strategies[args.data_parallel_sharding_strategy]
    # Megatron-LM overlaps sequence parallelism's backward gathers by itself: 'full'
    overlap = "full" if args.overlap_grad_reduce else "none"
    dtype = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    # Megatron-LM reduces gradients in fp32 under bf16 (arguments.py sets
    # accumulate_allreduce_grads_in_fp32 for bf16) unless --grad-reduce-in-bf16; under fp16 only
    # when --accumulate-allreduce-grads-in-fp32 is given
    fp32_grads = (dtype == "bf16" and not args.grad_reduce_in_bf16) or (
        dtype == "fp16" and args.accumulate_allreduce_grads_in_fp32
    )
    grad_bytes = 4 if fp32_grads or dtype == "fp32" else 2
    return TrainingSettings(
        dtype=_fp8(args, dtype),
        optimizer=args.optimizer,
        zero=zero,
        recompute=recompute,
        overlap=overlap,
        sequence_parallel=args.sequence_parallel,
        bucket_bytes=_bucket_bytes(args, dp, grad_bytes),
        fp32_grads=fp32_grads,
        # megatron-core's vocab_parallel_cross_entropy: the gradient written into the saved softmax
        loss_kernel="fused",
    )
