"""Which Megatron-LM flags a launch line may carry beside the ones the reader prices
(``planner.launch.megatron_read``): the flags proven not to change a training step's time or
memory, and older spellings of flags it prices, rewritten to today's.

    priced    the reader's parser (degrees, model shape, batch, precision, recompute, sharding,
              overlap, buckets): each changes the costed run
    INERT     data and tokenizer files, checkpoints, logging, evaluation, learning-rate and
              weight-decay schedules, optimizer hyperparameters, seeds, initialisation, exit
              conditions, process-group timeouts: none changes the operators a step runs, their
              shapes, or the bytes it holds (megatron/training/arguments.py, the groups
              _add_logging_args, _add_checkpointing_args, _add_data_args,
              _add_learning_rate_args, _add_regularization_args (values: the computation is the
              same), _add_initialization_args, _add_validation_args)
    LEGACY    Megatron-LM's older names (2020-2022 scripts) of flags it prices today
    anything else is refused with its name: a line is never costed with a flag dropped
"""

from __future__ import annotations

INERT = frozenset(
    {
        # data, tokenizer files and loading
        "--data-path", "--train-data-path", "--valid-data-path", "--test-data-path",
        "--data-cache-path", "--split", "--data-impl", "--mock-data", "--vocab-file",
        "--merge-file", "--num-workers", "--dataloader-type",
        "--no-mmap-bin-files", "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss",
        "--no-create-attention-mask-in-dataloader", "--sft", "--object-storage-cache-path",
        # checkpoints
        "--save", "--load", "--save-interval", "--no-save-optim", "--no-save-rng",
        "--no-load-optim", "--no-load-rng", "--finetune", "--use-checkpoint-args",
        "--use-dist-ckpt", "--auto-detect-ckpt-format", "--dist-ckpt-format", "--async-save",
        "--ckpt-fully-parallel-save", "--ckpt-fully-parallel-load",
        "--ckpt-assume-constant-structure", "--pretrained-checkpoint",
        "--exit-on-missing-checkpoint", "--non-persistent-save-interval",
        # logging and timing
        "--log-interval", "--tensorboard-dir", "--tensorboard-queue-size", "--log-throughput",
        "--log-params-norm", "--log-num-zeros-in-grad", "--log-timers-to-tensorboard",
        "--log-validation-ppl-to-tensorboard", "--log-memory-to-tensorboard",
        "--log-world-size-to-tensorboard", "--log-loss-scale-to-tensorboard",
        "--log-batch-size-to-tensorboard", "--log-learning-rate-to-tensorboard",
        "--timing-log-level", "--timing-log-option", "--wandb-project", "--wandb-exp-name",
        "--wandb-save-dir", "--log-progress", "--logging-level", "--no-barrier-with-level-1-timing",
        # evaluation and exit
        "--eval-iters", "--eval-interval", "--exit-interval", "--exit-duration-in-mins",
        "--exit-signal-handler", "--test-mode", "--skip-train",
        # schedules and optimizer hyperparameters (values only)
        "--train-iters", "--train-samples", "--lr", "--min-lr", "--lr-decay-style",
        "--lr-decay-iters", "--lr-decay-samples", "--lr-warmup-fraction", "--lr-warmup-iters",
        "--lr-warmup-samples", "--lr-warmup-init", "--weight-decay", "--start-weight-decay",
        "--end-weight-decay", "--weight-decay-incr-style", "--clip-grad", "--adam-beta1",
        "--adam-beta2", "--adam-eps", "--sgd-momentum", "--loss-scale", "--initial-loss-scale",
        "--min-loss-scale", "--loss-scale-window", "--hysteresis",
        # the first iterations' smaller batches: the steady step is --global-batch-size's
        "--rampup-batch-size",
        # seeds, initialisation, process groups
        "--seed", "--init-method-std", "--init-method-xavier-uniform", "--use-cpu-initialization",
        "--distributed-backend", "--distributed-timeout-minutes", "--local-rank", "--local_rank",
        "--rotary-base", "--norm-epsilon", "--layernorm-epsilon",
        # FP8 scaling bookkeeping (a per-tensor amax history and its reduction, a margin): the
        # casts are priced whatever scale they pick (planner/cost/compute.py)
        "--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin", "--fp8-interval",
        # the same model under either name
        "--use-mcore-models", "--use-legacy-models",
    }
)  # fmt: skip

# Megatron-DeepSpeed's flags (microsoft/Megatron-DeepSpeed, megatron/arguments.py's _add_deepspeed
# args): its ZeRO stage, pipeline engine and checkpointing come from DeepSpeed and its JSON config,
# which the planner does not read; such a line is refused as a whole, naming the flag.
DEEPSPEED = frozenset(
    {
        "--deepspeed", "--deepspeed_config", "--deepspeed-config", "--zero-stage",
        "--no-pipeline-parallel", "--deepspeed-activation-checkpointing",
        "--ds-sequence-parallel-size",
        "--cpu-optimizer", "--cpu_torch_adam", "--zero-contigious-gradients",
        "--zero-reduce-scatter", "--zero-allgather-bucket-size", "--remote-device",
    }
)  # fmt: skip

# old flag -> the words Megatron-LM reads today (megatron/training/arguments.py's renames)
LEGACY = {
    # Megatron-LM 2021: checkpoint every chunk of --checkpoint-num-layers (1) layers, uniformly
    "--checkpoint-activations": (
        "--recompute-granularity",
        "full",
        "--recompute-method",
        "uniform",
    ),
    "--recompute-activations": ("--recompute-granularity", "selective"),
    "--activations-checkpoint-method": ("--recompute-method",),
    "--activations-checkpoint-num-layers": ("--recompute-num-layers",),
    "--checkpoint-num-layers": ("--recompute-num-layers",),
}


def modern_words(words: list[str]) -> list[str]:
    """``words`` with every legacy flag rewritten (a switch to its flag and value, a renamed flag
    to its new name, keeping its value); ``--flag=value`` forms included."""
    out: list[str] = []
    for word in words:
        name, eq, value = word.partition("=")
        new = LEGACY.get(name)
        if new is None:
            out.append(word)
        elif len(new) > 1:
            out.extend(new)
        else:
            out.append(f"{new[0]}={value}" if eq else new[0])
    return out


def split_unknown(unknown: list[str]) -> tuple[str | None, tuple[str, ...]]:
    """(the first flag among ``unknown``, the words the reader's parser did not take, that is not
    inert, or None; the inert flags)."""
    flags = [w.split("=")[0] for w in unknown if w.startswith("--")]
    return next((f for f in flags if f not in INERT), None), tuple(flags)
