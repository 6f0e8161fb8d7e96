"""Training settings: what one training step does (dtype, optimizer, ZeRO stage, recompute), and how
the framework runs it (overlap of communication with compute, gradient buckets, fp32 gradients)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from planner.errors import SettingsError

# fp8: weights, activations and gradients kept in bf16 (2 bytes), the transformer layers' linear
# layers' GEMMs run in FP8 (Transformer Engine's recipe; ``planner.cost.compute``)
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}
DTYPES = tuple(DTYPE_BYTES)
OPTIMIZERS = ("adam", "sgd")
INTEGER_BYTES = 4
# Optimizer state bytes per parameter: mixed precision keeps an fp32 master copy.
OPTIMIZER_BYTES = {
    ("adam", "bf16"): 12,
    ("adam", "fp16"): 12,
    ("adam", "fp32"): 8,
    ("adam", "fp8"): 12,
    ("sgd", "bf16"): 8,
    ("sgd", "fp16"): 8,
    ("sgd", "fp32"): 4,
    ("sgd", "fp8"): 8,
}
OVERLAP = ("none", "grad", "full")
# the kernel of the loss's backward pass (its buffers: planner.pipeline.layer_costs)
LOSS_KERNELS = ("torch", "loss-parallel", "fused")
# the recompute ladder the searches climb, least memory saved first
RECOMPUTE = ("none", "selective", "full")
# every mode a plan may run: the ladder and torchtitan's operator policy (SelectiveAC), which keeps
# the outputs of the attention kernel and of every other matmul of a layer and re-runs the rest
RECOMPUTE_MODES = ("none", "selective", "selective-op", "full")
ZERO_STAGES = (0, 1, 2, 3)
# recompute / ZeRO decided per layer by the exact search (``layer_recompute``, ``layer_zero``)
AUTO = "auto"
# PyTorch DDP's default bucket_cap_mb (25 MiB): small tensors share a bucket's collective latency.
DEFAULT_BUCKET_BYTES = 25 * 2**20


def _option(
    flag: str,
    help: str,
    choices: tuple[str, ...] | None = None,
    unit: float = 1.0,
    metavar: str | None = None,
):
    """A field's command-line option: its flag, help and choices, and the unit the option counts
    in (the field's value / unit, named ``metavar``); the CLI builds the option from this and the
    field's default."""
    return {"flag": flag, "help": help, "choices": choices, "unit": unit, "metavar": metavar}


@dataclass(frozen=True, slots=True)
class TrainingSettings:
    """What a training step does: dtype, optimizer, ZeRO stage on data-parallel axes, recompute.

    ``recompute``: ``none``; ``selective`` (Korthikanti et al. 2022: the attention core, from the
    scores to the softmax and its dropout, is re-run in the backward pass instead of kept);
    ``selective-op`` (torchtitan's SelectiveAC: each layer keeps the outputs of its attention
    kernel, other batched contractions and every other matmul, and re-runs the rest); ``full`` (only
    layer inputs are kept; every layer is re-run). ``True``/``False`` read as ``full``/``none``.
    ``auto``: the exact search chooses none, selective or full per layer (``layer_recompute`` then
    holds its choice as ``(layer, mode)`` pairs; a layer not listed, and any operator outside the
    layers, runs without recompute). ``zero``: the ZeRO stage on data-parallel axes, or ``auto``:
    the exact search chooses 0-3 per layer (``layer_zero``; operators outside the layers keep stage
    0).
    ``sequence_parallel``: an activation that a tensor-parallel operator reads
    replicated is kept 1/t-sharded for the backward pass and gathered again there (Megatron-LM's
    sequence-parallel linear; the search places norms, dropouts and residuals sequence-sharded
    where that pays, as it always may).

    ``overlap``: which communication runs behind compute (``none``; ``grad``: gradient reduction
    behind the backward pass, as DDP and Megatron do; ``full``: also ZeRO-3's parameter gathers,
    prefetched as FSDP does). ``bucket_bytes``: parameter tensors share collectives in buckets of
    this many bytes, a larger tensor is one collective of its own (0: one per parameter tensor;
    ``planner.cost.operators.bucket_share``). ``fp32_grads``: gradients are kept in fp32 (Megatron's
    main gradients: 4 bytes, 18 bytes per parameter with Adam under mixed precision).
    ``loss_kernel``: the cross-entropy's backward as the engine runs it, which sets its transient
    buffers: ``torch`` (PyTorch's nll_loss and log_softmax backward), ``loss-parallel``
    (torchtitan's: DTensor's loss_parallel where the vocabulary is sharded, PyTorch's otherwise),
    ``fused`` (Megatron-LM's
    vocabulary-parallel cross-entropy, in place)."""

    dtype: str = field(
        default="bf16",
        metadata=_option(
            "--dtype",
            "element type of weights, activations and gradients; fp8: bf16 kept, the linear "
            "layers' GEMMs in FP8 (devices with FP8 tensor cores)",
            DTYPES,
        ),
    )
    optimizer: str = field(
        default="adam", metadata=_option("--optimizer", "optimizer (its state)", OPTIMIZERS)
    )
    zero: int = field(
        default=0,
        metadata=_option(
            "--zero",
            "ZeRO stage on data-parallel axes; auto = the exact method chooses a stage per layer",
            tuple(str(z) for z in ZERO_STAGES) + (AUTO,),
        ),
    )
    recompute: str = field(
        default="none",
        metadata=_option(
            "--recompute",
            "activation recompute: selective = the attention core (scores, softmax, its dropout) "
            "is re-run instead of kept; selective-op = torchtitan's operator policy: the outputs "
            "of the attention kernel and of every other matmul of a layer are kept, the rest "
            "re-run; full = only layer inputs are kept; auto = the exact method chooses none, "
            "selective or full per layer when memory binds",
            RECOMPUTE_MODES + (AUTO,),
        ),
    )
    overlap: str = field(
        default="full",
        metadata=_option(
            "--overlap",
            "communication behind compute: grad = gradient reduction behind the backward pass "
            "(DDP, Megatron), full = also ZeRO-3 gathers prefetched (FSDP)",
            OVERLAP,
        ),
    )
    bucket_bytes: float = field(
        default=DEFAULT_BUCKET_BYTES,
        metadata=_option(
            "--bucket-mb",
            "gradient bucket size in MiB: smaller tensors share a bucket's collective, a larger "
            "tensor is one collective of its own, latency paid once per collective (as DDP; 0: "
            "one collective per parameter tensor)",
            unit=2**20,
            metavar="MB",
        ),
    )
    fp32_grads: bool = field(
        default=False,
        metadata=_option(
            "--fp32-grads",
            "keep gradients in fp32 (Megatron's main gradients: 18 bytes per parameter with Adam)",
        ),
    )
    sequence_parallel: bool = field(
        default=False,
        metadata=_option(
            "--sequence-parallel",
            "keep activations that tensor-parallel operators read replicated 1/t-sharded and "
            "re-gather them in the backward pass (Megatron-LM's sequence parallelism)",
        ),
    )
    loss_kernel: str = field(
        default="torch",
        metadata=_option(
            "--loss-kernel",
            "the cross-entropy's backward: torch = PyTorch's nll_loss and log_softmax backward "
            "(2 fp32 buffers of the logits' shard), loss-parallel = torchtitan's: DTensor's "
            "loss_parallel on vocabulary-sharded logits (3), PyTorch's otherwise, fused = "
            "Megatron-LM's vocabulary-parallel cross-entropy (in place: 0)",
            LOSS_KERNELS,
        ),
    )
    layer_recompute: tuple[tuple[int, str], ...] = ()
    layer_zero: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.recompute, bool):
            object.__setattr__(self, "recompute", "full" if self.recompute else "none")
        if self.recompute not in RECOMPUTE_MODES + (AUTO,):
            raise SettingsError(
                f"recompute: must be one of {', '.join(RECOMPUTE_MODES + (AUTO,))}, got "
                f"{self.recompute!r}"
            )
        _check_layers("layer_recompute", self.layer_recompute, RECOMPUTE)
        if self.layer_recompute and self.recompute != AUTO:
            raise SettingsError("layer_recompute: per-layer modes need recompute 'auto'")
        _check_layers("layer_zero", self.layer_zero, ZERO_STAGES)
        if self.layer_zero and self.zero != AUTO:
            raise SettingsError("layer_zero: per-layer stages need zero 'auto'")
        if not isinstance(self.sequence_parallel, bool):
            raise SettingsError(
                f"sequence_parallel: must be true or false, got {self.sequence_parallel!r}"
            )
        if self.dtype not in DTYPE_BYTES:
            raise SettingsError(f"dtype: must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.optimizer not in OPTIMIZERS:
            raise SettingsError(f"optimizer: must be adam or sgd, got {self.optimizer!r}")
        if self.zero not in ZERO_STAGES + (AUTO,) or isinstance(self.zero, bool):
            raise SettingsError(f"zero: must be 0, 1, 2, 3 or auto, got {self.zero!r}")
        if self.overlap not in OVERLAP:
            raise SettingsError(
                f"overlap: must be one of {', '.join(OVERLAP)}, got {self.overlap!r}"
            )
        if (
            isinstance(self.bucket_bytes, bool)
            or not isinstance(self.bucket_bytes, (int, float))
            or not 0 <= self.bucket_bytes < 2**50
        ):
            raise SettingsError(
                f"bucket_bytes: must be a non-negative number of bytes, got {self.bucket_bytes!r}"
            )
        if self.loss_kernel not in LOSS_KERNELS:
            raise SettingsError(
                f"loss_kernel: must be one of {', '.join(LOSS_KERNELS)}, got {self.loss_kernel!r}"
            )
        # an option that would change nothing is refused
        if self.fp32_grads and self.dtype == "fp32":
            raise SettingsError("fp32_grads: gradients are fp32 already under dtype fp32")

    def recompute_at(self, layer: int | None) -> str:
        """The recompute mode of one layer (``None``: an operator outside the layers)."""
        if self.recompute != AUTO:
            return self.recompute
        return dict(self.layer_recompute).get(layer, "none") if layer is not None else "none"

    def zero_at(self, layer: int | None) -> int:
        """The ZeRO stage of one layer's parameters (``None``: an operator outside the layers)."""
        if self.zero != AUTO:
            return self.zero
        return dict(self.layer_zero).get(layer, 0) if layer is not None else 0

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def to_dict(self) -> dict:
        """The settings as plan files and CSV rows write them (the CLI's option names and
        values)."""
        return {
            "dtype": self.dtype,
            "optimizer": self.optimizer,
            "zero": self.zero,
            "recompute": self.recompute,
            "overlap": self.overlap,
            "bucket_mb": self.bucket_bytes / 2**20,
            "fp32_grads": self.fp32_grads,
            "sequence_parallel": self.sequence_parallel,
            "loss_kernel": self.loss_kernel,
            "layer_recompute": format_layer_modes(self.layer_recompute),
            "layer_zero": format_layer_modes(self.layer_zero),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "TrainingSettings":
        """The settings a plan file records (``to_dict``'s form; missing keys take defaults)."""
        default = cls()
        zero = data.get("zero", default.zero)
        return cls(
            dtype=data.get("dtype", default.dtype),
            optimizer=data.get("optimizer", default.optimizer),
            zero=zero if zero == AUTO else int(zero),
            recompute=data.get("recompute", default.recompute),
            overlap=data.get("overlap", default.overlap),
            bucket_bytes=float(data.get("bucket_mb", default.bucket_bytes / 2**20)) * 2**20,
            fp32_grads=bool(data.get("fp32_grads", default.fp32_grads)),
            sequence_parallel=bool(data.get("sequence_parallel", default.sequence_parallel)),
            loss_kernel=data.get("loss_kernel", default.loss_kernel),
            layer_recompute=parse_layer_modes(data.get("layer_recompute", "")),
            layer_zero=parse_layer_modes(data.get("layer_zero", ""), "layer_zero"),
        )

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element."""
        return 4 if self.fp32_grads else self.elem_bytes

    @property
    def optimizer_bytes(self) -> int:
        return OPTIMIZER_BYTES[(self.optimizer, self.dtype)]


def format_layer_modes(pairs: tuple[tuple[int, str], ...]) -> str:
    """``((0, 'full'), (1, 'full'), (2, 'none'))`` as ``full:0-1,none:2`` (runs of layers)."""
    runs: list[list] = []
    for layer, mode in pairs:
        if runs and runs[-1][0] == mode and runs[-1][2] == layer - 1:
            runs[-1][2] = layer
        else:
            runs.append([mode, layer, layer])
    return ",".join(f"{mode}:{a}" if a == b else f"{mode}:{a}-{b}" for mode, a, b in runs)


def parse_layer_modes(text: str, field: str = "layer_recompute") -> tuple[tuple[int, object], ...]:
    """The inverse of ``format_layer_modes`` (``layer_zero``: integer stages); raises
    ``SettingsError`` naming the field."""
    allowed = {str(m): m for m in (ZERO_STAGES if field == "layer_zero" else RECOMPUTE)}
    pairs = []
    for part in filter(None, (text or "").split(",")):
        mode, _, span = part.partition(":")
        first, _, last = span.partition("-")
        if mode not in allowed or not first.isdigit() or (last and not last.isdigit()):
            raise SettingsError(
                f"{field}: expected mode:first-last runs like 'full:0-11' or '1:0-11', got {part!r}"
            )
        pairs.extend((layer, allowed[mode]) for layer in range(int(first), int(last or first) + 1))
    return tuple(sorted(pairs))


def _check_layers(field: str, pairs: tuple, allowed: tuple) -> None:
    if isinstance(pairs, (str, bytes)) or not all(
        isinstance(pair, tuple) and len(pair) == 2 for pair in pairs
    ):
        raise SettingsError(f"{field}: needs (layer, mode) pairs, got {pairs!r}")
    layers = [layer for layer, _ in pairs]
    if layers != sorted(set(layers)) or any(
        not isinstance(layer, int)
        or isinstance(layer, bool)
        or layer < 0
        or mode not in allowed
        or isinstance(mode, bool)
        for layer, mode in pairs
    ):
        raise SettingsError(
            f"{field}: needs (layer >= 0, one of {', '.join(map(str, allowed))}) pairs in "
            f"increasing layer order, got {pairs!r}"
        )


def flag_message(message: str) -> str:
    """A settings error as the command line reports it: the field it names at its start
    (``recompute: ...``) spelled as that field's option (``--recompute: ...``)."""
    for f in option_fields():
        if message.startswith(f"{f.name}:"):
            return f.metadata["flag"] + message[len(f.name) :]
    return message


def option_fields() -> tuple:
    """The fields of ``TrainingSettings`` the command line offers (in a fixed order), each with
    its option in ``metadata``."""
    return tuple(f for f in fields(TrainingSettings) if "flag" in f.metadata)


def option_default(f) -> object:
    """A field's default as its option spells it (in the option's unit)."""
    unit = f.metadata["unit"]
    return f.default / unit if unit != 1.0 else f.default


def option_name(f) -> str:
    """The argparse destination of a field's option (``bucket_mb`` for ``--bucket-mb``)."""
    return f.metadata["flag"].lstrip("-").replace("-", "_")
