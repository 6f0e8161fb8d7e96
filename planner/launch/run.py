"""A configuration to launch, in the planner's terms: what a Megatron-LM line or a torchtitan
config says (``planner.launch.megatron``, ``planner.launch.torchtitan``)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.settings import TrainingSettings
from planner.errors import SettingsError
from planner.zoo import GPTConfig, LlamaConfig


@dataclass(frozen=True, slots=True)
class LaunchRun:
    """One configuration an engine launches: the model, the degrees, the batch and the settings
    (what a Megatron-LM line or a torchtitan config says, in the planner's terms)."""

    model: GPTConfig | LlamaConfig
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    micro_batch: int
    global_batch: int
    settings: TrainingSettings
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B)
    cuts: tuple[int, ...] | None = None  # first layer of stages 1..p-1; None: even split
    gpipe: bool = False  # all forwards, then all backwards (torchtitan has it; Megatron-LM not)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel

    def nodes(self, gpus_per_node: int) -> tuple[int, int]:
        """(nodes, GPUs per node) of the world on nodes of ``gpus_per_node``; SettingsError when
        the world is not whole nodes."""
        per_node = min(gpus_per_node, self.world_size)
        if self.world_size % per_node:
            raise SettingsError(
                f"--mesh: {self.world_size} devices are not whole nodes of {per_node} GPUs"
            )
        return self.world_size // per_node, per_node

    @property
    def schedule(self) -> str:
        if self.gpipe:
            return "gpipe"
        return "1f1b" if self.virtual_stages == 1 else f"interleaved:{self.virtual_stages}"

    @property
    def model_spec(self) -> str:
        """The zoo's parametric spec of the model (``gpt:...`` or ``llama:...``)."""
        cfg = self.model
        if isinstance(cfg, LlamaConfig):
            fields = ("layers", "hidden", "heads", "kv_heads", "ffn", "seq", "vocab")
            text = ",".join(f"{name}={getattr(cfg, name)}" for name in fields)
            return f"llama:{text}" + (",attention=explicit" if cfg.attention != "fused" else "")
        fields = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "dropout")
        text = ",".join(f"{name}={getattr(cfg, name)}" for name in fields)
        return f"gpt:{text}" + (",attention=fused" if cfg.attention == "fused" else "")
