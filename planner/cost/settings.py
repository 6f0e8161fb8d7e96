"""Training settings: what one training step does (dtype, optimizer, ZeRO stage, recompute)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import SettingsError

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
INTEGER_BYTES = 4
# Optimizer state bytes per parameter: mixed precision keeps an fp32 master copy.
OPTIMIZER_BYTES = {("adam", "bf16"): 12, ("adam", "fp16"): 12, ("adam", "fp32"): 8,
                   ("sgd", "bf16"): 8, ("sgd", "fp16"): 8, ("sgd", "fp32"): 4}


@dataclass(frozen=True, slots=True)
class TrainingSettings:
    """What a training step does: dtype, optimizer, ZeRO stage on data-parallel axes, recompute."""

    dtype: str = "bf16"
    optimizer: str = "adam"
    zero: int = 0
    recompute: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise SettingsError(f"--dtype: must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.optimizer not in ("adam", "sgd"):
            raise SettingsError(f"--optimizer: must be adam or sgd, got {self.optimizer!r}")
        if self.zero not in (0, 1, 2, 3):
            raise SettingsError(f"--zero: must be 0, 1, 2 or 3, got {self.zero!r}")

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def optimizer_bytes(self) -> int:
        return OPTIMIZER_BYTES[(self.optimizer, self.dtype)]
