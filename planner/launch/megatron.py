"""Megatron-LM launch arguments for a 3D plan, and a Megatron-LM command line read back.

Every flag is Megatron-LM's own (``megatron/training/arguments.py`` in megatron-core 0.19):

    model     GPT:   --num-layers --hidden-size --num-attention-heads --ffn-hidden-size
                     --seq-length --max-position-embeddings --vocab-size (NullTokenizer); learned
                     positions, LayerNorm, GeLU, biases and a tied head are Megatron's defaults;
                     --attention-backend unfused (the zoo's GPT stores the s x s scores)
              LLaMA: the same and --swiglu --normalization RMSNorm --position-embedding-type
                     rope --group-query-attention --num-query-groups --disable-bias-linear
                     --untie-embeddings-and-output-weights, --attention-backend flash (fused) or
                     unfused (explicit); dropout 0 unless the GPT has dropout=1
    degrees   t = the stage-mesh axis on which the layers' linears split a non-batch dim
              --tensor-model-parallel-size t  --pipeline-model-parallel-size p
              data parallel d = world / (t p), the world being torchrun's --nnodes x
              --nproc-per-node
    schedule  1f1b: Megatron's default; interleaved:v: --num-virtual-stages-per-pipeline-rank v;
              gpipe has no Megatron schedule (refused)
    cuts      even: nothing; uneven: --pipeline-model-parallel-layout 'Et..|t..|..tL' (E the
              embedding, t a decoder layer, L the output layer and loss; '|' between stages)
    batch     --micro-batch-size = the plan's micro-batch / d (a 3D plan's micro-batch is the
              global one); --global-batch-size = micro-batch-size x d x num_microbatches
    settings  sequence_parallel: --sequence-parallel; recompute selective:
              --recompute-granularity selective; full: --recompute-granularity full
              --recompute-method uniform --recompute-num-layers 1; ZeRO-1:
              --use-distributed-optimizer; ZeRO-2 / 3: Megatron-FSDP (--use-megatron-fsdp
              --data-parallel-sharding-strategy optim_grads / optim_grads_params); overlap grad
              or full: --overlap-grad-reduce (and --overlap-param-gather beside a sharded
              optimizer with full); bf16 / fp16: --bf16 / --fp16, with --grad-reduce-in-bf16
              under bf16 unless fp32_grads (Megatron keeps fp32 main gradients for bf16 by
              default) and --accumulate-allreduce-grads-in-fp32 under fp16 with fp32_grads;
              --optimizer adam / sgd
    vocab     Megatron pads the vocabulary to a multiple of --make-vocab-size-divisible-by x t;
              the export picks the divisor that pads nothing, the reader applies the padding

A plan the flags cannot express (GPipe, a stage plan that is not Megatron's pattern, per-layer
recompute or ZeRO choices, mixtures of experts) is refused with the field that stops it.
"""

from __future__ import annotations

import shlex
from planner.cost.settings import TrainingSettings
from planner.launch.run import LaunchRun
from planner.errors import SettingsError
from planner.zoo import LlamaConfig

SCRIPT = {"gpt": "pretrain_gpt.py", "llama": "pretrain_gpt.py"}
# Megatron-LM flags whose effect the cost model does not have: a line that sets them is refused
UNSUPPORTED = (
    "--num-experts",
    "--fp8-param-gather",
    "--cpu-offloading",
    "--recompute-modules",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
)


# what a line needs to start that a plan does not decide: synthetic data, an iteration count and
# a learning rate, each inert for a step's cost (megatron_flags.INERT); PLACEHOLDER_NOTE says so
PLACEHOLDERS = ("--mock-data", "--train-iters", "100", "--lr", "1.0e-4")
PLACEHOLDER_NOTE = (
    "# placeholders: --mock-data (synthetic tokens: give --data-path and your tokenizer), "
    "--train-iters 100 and --lr 1.0e-4 (your schedule); none changes the step costed here"
)


def megatron_args(run: LaunchRun) -> list[str]:
    """The Megatron-LM arguments of ``run`` (see the module text), one flag or value per item,
    with the placeholders a line needs to start (``PLACEHOLDERS``)."""
    return (
        _model_args(run)
        + _parallel_args(run)
        + _settings_args(
            run.settings, run.model.layers // (run.pipeline_parallel * run.virtual_stages)
        )
        + list(PLACEHOLDERS)
    )


def block_modes(layers: int, chunk: int, first: int) -> tuple[tuple[int, str], ...]:
    """Megatron-LM's block recompute as per-layer modes: each model chunk of ``chunk`` consecutive
    layers (a pipeline stage, or a virtual stage of one) re-runs its first ``first`` layers in
    full and keeps the rest (megatron-core's recompute.py, checkpointed_forward)."""
    return tuple((layer, "full" if layer % chunk < first else "none") for layer in range(layers))


def block_count(modes: tuple[tuple[int, str], ...], layers: int, chunk: int) -> int | None:
    """The ``first`` of ``block_modes`` that gives ``modes`` (None: no block recompute does)."""
    return next((n for n in range(chunk + 1) if block_modes(layers, chunk, n) == modes), None)


def shell_line(run: LaunchRun, gpus_per_node: int) -> str:
    """A launch line: torchrun over ``world / gpus_per_node`` nodes running pretrain_gpt.py."""
    nodes, per_node = run.nodes(gpus_per_node)
    # Megatron-LM asks for one CUDA connection beside tensor parallelism (the order of its
    # overlapped collectives), and for more than one beside Megatron-FSDP
    env = ["CUDA_DEVICE_MAX_CONNECTIONS=1"] if run.settings.zero < 2 else []
    launch = env + [
        "torchrun",
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        str(per_node),
        "pretrain_gpt.py",
    ]
    return shlex.join(launch + megatron_args(run))


def _model_args(run: LaunchRun) -> list[str]:
    cfg, tp = run.model, run.tensor_parallel
    if cfg.vocab % tp:
        raise SettingsError(
            f"--target megatron: the vocabulary ({cfg.vocab}) is not divisible by the "
            f"tensor-parallel degree {tp} (Megatron splits the embedding over it)"
        )
    divisor = next(d for d in (128, 64, 32, 16, 8, 4, 2, 1) if cfg.vocab % (d * tp) == 0)
    ffn = cfg.ffn or 4 * cfg.hidden
    args = ["--num-layers", cfg.layers, "--hidden-size", cfg.hidden]
    args += ["--num-attention-heads", cfg.heads, "--ffn-hidden-size", ffn]
    args += ["--seq-length", cfg.seq, "--max-position-embeddings", cfg.seq]
    args += ["--tokenizer-type", "NullTokenizer", "--vocab-size", cfg.vocab]
    args += ["--make-vocab-size-divisible-by", divisor]
    if isinstance(cfg, LlamaConfig):
        if cfg.experts:
            raise SettingsError("--target megatron: mixtures of experts are not exported yet")
        args += ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope"]
        args += ["--group-query-attention", "--num-query-groups", cfg.kv_heads]
        args += ["--disable-bias-linear", "--untie-embeddings-and-output-weights"]
        args += ["--attention-backend", "flash" if cfg.attention == "fused" else "unfused"]
    else:
        if cfg.experts:
            raise SettingsError("--target megatron: mixtures of experts are not exported yet")
        args += ["--attention-backend", "flash" if cfg.attention == "fused" else "unfused"]
    if isinstance(cfg, LlamaConfig) or not cfg.dropout:
        args += ["--attention-dropout", "0", "--hidden-dropout", "0"]
    return [str(a) for a in args]


def _parallel_args(run: LaunchRun) -> list[str]:
    args = ["--tensor-model-parallel-size", run.tensor_parallel]
    args += ["--pipeline-model-parallel-size", run.pipeline_parallel]
    args += ["--micro-batch-size", run.micro_batch, "--global-batch-size", run.global_batch]
    if run.virtual_stages > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", run.virtual_stages]
    if run.cuts is not None and run.cuts != even_cuts(run.model.layers, run.pipeline_parallel):
        args += ["--pipeline-model-parallel-layout", layout_string(run.cuts, run.model.layers)]
    if run.settings.sequence_parallel:
        args.append("--sequence-parallel")
    return [str(a) for a in args]


def _settings_args(settings: TrainingSettings, chunk: int) -> list[str]:
    """The recompute, sharding, overlap and precision flags (``chunk``: layers per model chunk,
    the unit of block recompute)."""
    args: list[str] = []
    if settings.layer_recompute:
        layers = len(settings.layer_recompute)
        first = block_count(settings.layer_recompute, layers, chunk)
        if first is None:
            raise SettingsError(
                "--target megatron: per-layer recompute is exported as Megatron-LM's block "
                f"recompute (the first N layers of each chunk of {chunk}); these modes are not"
            )
        args += ["--recompute-granularity", "full", "--recompute-method", "block"]
        args += ["--recompute-num-layers", str(first)]
    if settings.recompute == "selective-op":
        raise SettingsError(
            "--target megatron: Megatron-LM has no operator-level selective checkpointing "
            "(torchtitan's policy); plan with --recompute selective or full"
        )
    if settings.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif settings.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform"]
        args += ["--recompute-num-layers", "1"]
    if settings.zero == 1:
        args.append("--use-distributed-optimizer")
    elif settings.zero in (2, 3):
        strategy = "optim_grads" if settings.zero == 2 else "optim_grads_params"
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy]
        args += ["--ckpt-format", "fsdp_dtensor"]  # Megatron-FSDP saves only this format
    if settings.overlap != "none":
        args.append("--overlap-grad-reduce")
        if settings.overlap == "full" and settings.zero == 1:
            args.append("--overlap-param-gather")
    if settings.dtype == "fp8":
        # bf16 tensors, the linear layers' GEMMs in FP8: E4M3 forward, E5M2 gradients
        args += ["--fp8-format", "hybrid"]
    if settings.dtype != "fp32":
        args.append("--bf16" if settings.dtype == "fp8" else f"--{settings.dtype}")
        # Megatron-LM's gradient buffer: fp32 under bf16 unless told, fp16 under fp16 unless told
        if settings.dtype in ("bf16", "fp8") and not settings.fp32_grads:
            args.append("--grad-reduce-in-bf16")
        elif settings.dtype == "fp16" and settings.fp32_grads:
            args.append("--accumulate-allreduce-grads-in-fp32")
    # Megatron's bucket is counted in parameters (gradient elements)
    bucket = round(settings.bucket_bytes / settings.grad_bytes)
    args += ["--ddp-bucket-size", str(bucket)] if bucket else []
    return args + ["--optimizer", settings.optimizer]


def even_cuts(layers: int, stages: int) -> tuple[int, ...] | None:
    """Megatron's default split (layers / stages each), None when it does not divide."""
    if layers % stages:
        return None
    return tuple(k * layers // stages for k in range(1, stages))


def layout_string(cuts: tuple[int, ...], layers: int) -> str:
    """``--pipeline-model-parallel-layout`` of the stages that start at ``cuts``."""
    bounds = (0, *cuts, layers)
    stages = ["t" * (b - a) for a, b in zip(bounds, bounds[1:])]
    return "|".join(
        ("E" if k == 0 else "") + s + ("L" if k == len(stages) - 1 else "")
        for k, s in enumerate(stages)
    )


def layout_cuts(layout: str, stages: int) -> tuple[int, ...]:
    """The cuts of a ``--pipeline-model-parallel-layout`` written as ``layout_string`` writes it
    (one chunk per stage, the embedding first and the loss last)."""
    chunks = layout.replace(" ", "").split("|")
    if len(chunks) != stages:
        raise SettingsError(
            f"--pipeline-model-parallel-layout: {len(chunks)} chunks for {stages} stages (one "
            "chunk per stage is read; virtual stages in a layout are not)"
        )
    counts = [chunk.count("t") for chunk in chunks]
    extra = "".join(c for chunk in chunks for c in chunk if c not in "tEL")
    if extra or not chunks[0].startswith("E") or not chunks[-1].endswith("L"):
        raise SettingsError(
            f"--pipeline-model-parallel-layout: {layout!r} is not 'Et..|t..|..tL' (decoder "
            "layers t, the embedding first, the loss last)"
        )
    return tuple(sum(counts[:k]) for k in range(1, stages))
