"""A torchtitan 0.3 ``config_registry`` file read back into a ``LaunchRun`` (``planner evaluate
--from-torchtitan``): loaded and validated by torchtitan's own ``ConfigManager``, its degrees
checked by torchtitan's ``ParallelDims``, then mapped as ``planner.launch.torchtitan`` exports
(the inverse mapping). Needs torchtitan (and the triton it imports)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

from planner.cost.settings import TrainingSettings
from planner.launch.run import LaunchRun
from planner.launch.torchtitan import FLAVORS
from planner.errors import SettingsError
from planner.units import MAX_COUNT
from planner.zoo import LLAMA_PRESETS

SCHEDULES = {"GPipe": "gpipe", "1F1B": "1f1b", "Interleaved1F1B": "interleaved"}


def load_config(path: str, name: str):
    """The ``Trainer.Config`` that function ``name`` returns, through torchtitan's ConfigManager
    (which validates it). ``path``: a config_registry file, or a module name as torchtitan's own
    ``--module`` takes it (``llama3``: torchtitan's registry). A file is imported under a name of
    its own, so that ``llama3.py`` is the user's file and not torchtitan's registry of that name
    and ``json.py`` shadows nothing; its Python runs in this process (the docs say so)."""
    try:
        from torchtitan.config import ConfigManager
    except ImportError as exc:
        raise SettingsError(
            f"--from-torchtitan: torchtitan does not import here ({exc}); pip install "
            "torchtitan==0.3.0 triton"
        ) from None
    module = path if _is_module_name(path) else _import_file(path)
    try:
        return ConfigManager().parse_args(["--module", module, "--config", name])
    except (ValueError, ImportError, AssertionError, AttributeError, KeyError) as exc:
        raise SettingsError(f"--from-torchtitan: torchtitan refuses {path}: {exc}") from None
    except SystemExit:  # tyro prints why and exits
        raise SettingsError(f"--from-torchtitan: torchtitan refuses {path} (above)") from None


def _is_module_name(path: str) -> bool:
    return not path.endswith(".py") and "/" not in path and not Path(path).exists()


def _import_file(path: str) -> str:
    """Import the config file at ``path`` as a module of its own name; that name."""
    file = Path(path).resolve()
    if not file.is_file() or file.suffix != ".py":
        raise SettingsError(f"--from-torchtitan: {path} is not a Python config_registry file")
    alias = f"planner_torchtitan_config_{abs(hash(str(file)))}"
    spec = importlib.util.spec_from_file_location(alias, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:
        raise SettingsError(f"--from-torchtitan: {path} exits ({exc.code}) when read") from None
    except Exception as exc:  # the user's Python: any error is its own, reported in one line
        raise SettingsError(
            f"--from-torchtitan: {path} raises {type(exc).__name__} when read: {exc}"
        ) from None
    return alias


def read_torchtitan(path: str, name: str = "planner_plan", dp: int | None = None) -> LaunchRun:
    """The run a torchtitan config describes; ``dp`` for a shard degree of -1 (the rest)."""
    config = load_config(path, name)
    p = config.parallelism
    shard, replicate = p.data_parallel_shard_degree, p.data_parallel_replicate_degree
    if shard == -1:
        if dp is None:
            raise SettingsError(
                "--dp: the config's data_parallel_shard_degree is -1 (the rest of the world): "
                "give the data-parallel degree"
            )
        shard = dp // replicate
    if shard > 1 and replicate > 1:
        raise SettingsError(
            "--from-torchtitan: HSDP (shard and replicate degrees both > 1) is not modelled yet"
        )
    for key in ("context_parallel_degree", "expert_parallel_degree"):
        if getattr(p, key) != 1:
            raise SettingsError(f"--from-torchtitan: parallelism.{key} > 1 is not modelled yet")
    _refuse_unpriced(config)
    _refuse_converted(config.model_spec.model)
    return _run(config, shard, replicate)


# (section, key, the value the planner prices, what another value does)
UNPRICED = (
    ("training", "enable_cpu_offload", False, "offloads parameters and optimizer state to the CPU"),
    ("training", "mixed_precision_reduce", "float32", "reduces gradients in another dtype"),
    ("parallelism", "pipeline_parallel_schedule_csv", "", "runs a schedule from a file"),
    ("compile", "enable", False, "fuses kernels with torch.compile"),
    ("compile", "enable_async_tensor_parallel", False, "overlaps tensor-parallel collectives"),
)


def _refuse_unpriced(config) -> None:
    """SettingsError naming a config key whose value changes the step in a way the cost model
    does not price (the eager bf16 step it prices: no offload, fp32 reduction, no compile)."""
    for section, key, priced, effect in UNPRICED:
        value = getattr(getattr(config, section), key)
        if value != priced:
            raise SettingsError(
                f"--from-torchtitan: {section}.{key} = {value!r} {effect}, which the planner "
                f"does not price (set it to {priced!r} to cost the step without it)"
            )


# where torchtitan keeps its model converters (float8, MX and NVFP4 linears and grouped GEMMs):
# a converted model runs its GEMMs in another precision, which the planner does not price
QUANTIZATION = "torchtitan.components.quantization"


def _refuse_converted(model, path: str = "model_spec.model", depth: int = 0) -> None:
    """SettingsError naming the first part of the model's config tree that a quantization
    converter made (``model_registry(flavor, converters=[Float8LinearConverter.Config()])``)."""
    kind = type(model)
    if kind.__module__.startswith(QUANTIZATION):
        raise SettingsError(
            f"--from-torchtitan: {path} is a {kind.__qualname__} (a model converter's low-"
            "precision training), which the planner does not price (drop the converter to cost "
            "the bf16 step)"
        )
    if depth > 32 or not hasattr(model, "__dataclass_fields__"):
        return
    for name in model.__dataclass_fields__:
        value = getattr(model, name, None)
        for k, item in enumerate(value if isinstance(value, (list, tuple)) else (value,)):
            where = f"{path}.{name}" + (f"[{k}]" if isinstance(value, (list, tuple)) else "")
            _refuse_converted(item, where, depth + 1)


def _count(section: str, key: str, value) -> int:
    """A count of the config, or a SettingsError naming its key (the command line's bound)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < MAX_COUNT:
        raise SettingsError(
            f"--from-torchtitan: {section}.{key} must be a positive integer below 2^40, got "
            f"{value!r}"
        )
    return value


def _batches(config, dp: int, pp: int) -> tuple[int, int]:
    """(micro-batch per replica, global batch) as torchtitan derives them: the global batch is
    local x dp x gradient-accumulation steps, and a pipeline splits the local batch into
    micro-batches of ``pipeline_parallel_microbatch_size``."""
    training, p = config.training, config.parallelism
    local = _count("training", "local_batch_size", training.local_batch_size)
    given = training.global_batch_size
    batch = local * dp if given in (-1, 0) else _count("training", "global_batch_size", given)
    if batch % (local * dp):
        raise SettingsError(
            f"--from-torchtitan: training.global_batch_size ({batch}) is not a multiple of "
            f"training.local_batch_size ({local}) x dp ({dp})"
        )
    if pp == 1:
        return local, batch
    micro = _count(
        "parallelism", "pipeline_parallel_microbatch_size", p.pipeline_parallel_microbatch_size
    )
    if local % micro:
        raise SettingsError(
            f"--from-torchtitan: training.local_batch_size ({local}) is not a multiple of "
            f"parallelism.pipeline_parallel_microbatch_size ({micro})"
        )
    return micro, batch


def _model(config):
    spec = config.model_spec
    wanted = f"llama3_{str(spec.flavor).lower()}"
    preset = next((name for name, fn in FLAVORS.items() if fn == wanted), None)
    if spec.name != "llama3" or preset is None:
        raise SettingsError(
            f"--from-torchtitan: model {spec.name} {spec.flavor} is not a LLaMA 3 8B/70B/405B"
        )
    return replace(
        LLAMA_PRESETS[preset], seq=_count("training", "seq_len", config.training.seq_len)
    )


def _run(config, shard: int, replicate: int) -> LaunchRun:
    p = config.parallelism
    dp, pp = shard * replicate, p.pipeline_parallel_degree
    model = _model(config)
    schedule = SCHEDULES.get(p.pipeline_parallel_schedule) if pp > 1 else "1f1b"
    if schedule is None:
        raise SettingsError(
            f"--from-torchtitan: schedule {p.pipeline_parallel_schedule} is not modelled (GPipe, "
            "1F1B, Interleaved1F1B)"
        )
    parts = p.module_fqns_per_model_part or _default_parts(p, pp, model.layers)
    virtual = len(parts) // pp if pp > 1 else 1
    counts = [sum(m.startswith("layers.") for m in part) for part in parts]
    cuts = tuple(sum(counts[:k]) for k in range(1, len(counts))) if virtual == 1 else None
    micro, batch = _batches(config, dp, pp)
    return LaunchRun(
        model,
        p.tensor_parallel_degree,
        pp,
        dp,
        micro,
        batch,
        _settings(config, shard, pp),
        virtual,
        cuts if pp > 1 else None,
        schedule == "gpipe",
    )


def _default_parts(parallelism, pp: int, layers: int) -> list[list[str]]:
    """The model parts torchtitan builds when the config names none: its own
    ``_get_pipeline_metadata`` (two virtual stages a rank under a multi-stage schedule unless
    ``pipeline_parallel_layers_per_stage`` says otherwise; the first and last stages
    ``..._less_layers`` lighter) and ``_generate_llm_fqn_per_model_part``."""
    from types import SimpleNamespace

    from torchtitan.distributed import pipeline_parallel as tt

    try:
        stages, _, first, last = tt._get_pipeline_metadata(
            SimpleNamespace(pp=pp), parallelism, SimpleNamespace(layers=[None] * layers)
        )
        return tt._generate_llm_fqn_per_model_part(stages, layers, first, last)
    except ValueError as exc:
        raise SettingsError(f"--from-torchtitan: torchtitan refuses its pipeline: {exc}") from None


def _zero(reshard: str, shard: int, pp: int) -> int:
    """The ZeRO stage whose memory and collectives FSDP2 has under torchtitan.

    Without pipelining: 'always' (and torchtitan's 'default') reshards after forward, ZeRO-3;
    'never' keeps the gathered weights to the backward pass, ZeRO-2. With pipelining, torch's
    stage runs every micro-batch's backward with ``set_requires_gradient_sync(False)`` and
    ``set_reshard_after_backward(False)`` and reduces once in ``perform_reduce_grad``
    (torch/distributed/pipelining/stage.py); FSDP2 accumulates the unsharded gradient in the
    reduce dtype meanwhile (``FSDPParam.to_accumulated_grad_if_needed``): gathered weights,
    whole fp32 gradients and sharded optimizer state, one reduce-scatter and one gather a step,
    which is ZeRO-1 (Megatron's distributed optimizer) with fp32 gradients."""
    if shard == 1:
        return 0
    if pp == 1:
        return 2 if reshard == "never" else 3
    if reshard == "always":
        raise SettingsError(
            "--from-torchtitan: parallelism.fsdp_reshard_after_forward 'always' beside pipeline "
            "parallelism is not modelled (each micro-batch gathers again; use 'default')"
        )
    return 1


def _recompute(ac) -> str:
    """torchtitan's activation checkpointing as a recompute mode: none, FullAC (full) or
    SelectiveAC with its default policy (selective-op); others, and a SelectiveAC whose save set
    or forced recomputes differ from the policy the planner costs, are refused."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    if ac is None:
        return "none"
    if type(ac) is FullAC.Config:
        return "full"
    if type(ac) is SelectiveAC.Config and ac.force_recompute_mm_shapes_by_fqns == list(
        SelectiveAC.Config().force_recompute_mm_shapes_by_fqns
    ):
        return "selective-op"
    raise SettingsError(
        f"--from-torchtitan: activation checkpointing {type(ac).__qualname__} is not modelled "
        "(none, FullAC or SelectiveAC with its default policy)"
    )


def _settings(config, shard: int, pp: int) -> TrainingSettings:
    if config.training.mixed_precision_param != "bfloat16":
        raise SettingsError(
            "--from-torchtitan: training.mixed_precision_param other than bfloat16 is not "
            "modelled (the planner prices bf16 compute with fp32 master weights and gradients)"
        )
    zero = _zero(config.parallelism.fsdp_reshard_after_forward, shard, pp)
    sequence_parallel = config.parallelism.enable_sequence_parallel
    return TrainingSettings(
        dtype="bf16",
        zero=zero,
        recompute=_recompute(config.activation_checkpoint),
        fp32_grads=True,
        sequence_parallel=bool(sequence_parallel and config.parallelism.tensor_parallel_degree > 1),
        # torchtitan's cross_entropy_loss: its loss-parallel kernel on vocabulary-sharded logits
        loss_kernel="loss-parallel",
    )
