"""The model zoo: ``load_model("gpt2-small")``, parametric ``gpt:layers=4,hidden=512,heads=8``.

``batch`` (global batch) and ``seq`` (sequence length, language models only) override defaults.
"""

from __future__ import annotations

import re

import difflib
from dataclasses import replace

from planner.errors import ModelError
from planner.ir.graph import Graph
from planner.zoo.transformers import LM_BATCH, GPTConfig, bert, gpt, mlp, transformer_block
from planner.zoo.encoders import t5, vit
from planner.zoo.llama import LlamaConfig, llama
from planner.zoo.vision import VISION_BATCH, resnet, vgg16

GPT_PRESETS: dict[str, GPTConfig] = {
    "gpt2-small": GPTConfig(12, 768, 12, 1024),
    "gpt2-medium": GPTConfig(24, 1024, 16, 1024),
    "gpt2-large": GPTConfig(36, 1280, 20, 1024),
    "gpt2-xl": GPTConfig(48, 1600, 25, 1024),
    "gpt3-1.3b": GPTConfig(24, 2048, 16, 2048, 51200),
    "gpt3-2.7b": GPTConfig(32, 2560, 32, 2048, 51200),
    "gpt3-6.7b": GPTConfig(32, 4096, 32, 2048, 51200),
    "gpt3-13b": GPTConfig(40, 5120, 40, 2048, 51200),
    "gpt3-175b": GPTConfig(96, 12288, 96, 2048, 51200),
    "moe-gpt": GPTConfig(12, 768, 12, 1024, experts=8),
}
# published configurations (Meta's LLaMA 3, Mistral's Mixtral)
LLAMA_PRESETS: dict[str, LlamaConfig] = {
    "llama3-8b": LlamaConfig(32, 4096, 32, 8, 14336),
    "llama3-70b": LlamaConfig(80, 8192, 64, 8, 28672),
    "llama3-405b": LlamaConfig(126, 16384, 128, 8, 53248),
    "mixtral-8x7b": LlamaConfig(32, 4096, 32, 8, 14336, seq=4096, vocab=32000, experts=8, top_k=2),
}
LLAMA_PARAMETRIC = {"llama": LLAMA_PRESETS["llama3-8b"], "moe": LLAMA_PRESETS["mixtral-8x7b"]}
BERT_PRESETS = {"bert-base": (12, 768, 12), "bert-large": (24, 1024, 16)}
VISION = {
    "resnet50": lambda b: resnet((3, 4, 6, 3), b, name="resnet50"),
    "resnet101": lambda b: resnet((3, 4, 23, 3), b, name="resnet101"),
    "resnet152": lambda b: resnet((3, 8, 36, 3), b, name="resnet152"),
    "wide-resnet50-2": lambda b: resnet((3, 4, 6, 3), b, width_factor=2, name="wide-resnet50-2"),
    "vgg16": lambda b: vgg16(b),
}
OTHER = ("mlp", "transformer-block")
ENCODERS = {
    "vit-h14": lambda batch, seq: vit(batch=batch or VISION_BATCH),
    "t5-3b": lambda batch, seq: t5(batch=batch or LM_BATCH, seq=seq or 512),
}
PARAMETRIC = {"gpt": GPTConfig(12, 768, 12, 1024), "moe-gpt": GPT_PRESETS["moe-gpt"]}


def model_names() -> list[str]:
    return (
        list(OTHER)
        + list(GPT_PRESETS)
        + list(LLAMA_PRESETS)
        + list(BERT_PRESETS)
        + list(VISION)
        + list(ENCODERS)
    )


# bounds on a parametric model's integers: a layer count beyond any published model (the largest
# have under 200 layers) would only build a graph for minutes; other sizes as the graph reader's
MAX_LAYERS = 4096
MAX_SIZE = 2**48


def _bounded(key: str, value: str) -> int:
    """``value`` as an integer within the bounds (0 allowed: a switch such as ``dropout=0``; the
    model checks its own minimums), or a ModelError naming ``key`` (the value echoed at most 20
    characters long)."""
    shown = value if len(value) <= 20 else value[:20] + "..."
    if not re.fullmatch(r"[0-9]+", value) or len(value) > 16:
        raise ModelError(f"--model: parameter {key!r} needs an integer, got {shown!r}")
    limit = MAX_LAYERS if key == "layers" else MAX_SIZE
    if int(value) > limit:
        raise ModelError(f"--model: parameter {key!r} is at most {limit}, got {shown}")
    return int(value)


def _parse_params(spec: str, base: GPTConfig) -> GPTConfig:
    fields = {}
    for item in filter(None, spec.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in GPTConfig.__slots__:
            raise ModelError(
                f"--model: cannot parse parameter {item!r} (known: "
                f"{', '.join(GPTConfig.__slots__)})"
            )
        if key == "attention":
            fields[key] = value
            continue
        if key != "capacity_factor":
            fields[key] = _bounded(key, value)
            continue
        try:
            fields[key] = float(value)
        except ValueError:
            raise ModelError(f"--model: parameter {key!r} needs a number, got {value!r}") from None
    return replace(base, **fields)


def _parse_llama(spec: str, base: LlamaConfig) -> LlamaConfig:
    fields: dict[str, object] = {}
    for item in filter(None, spec.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in LlamaConfig.__slots__:
            raise ModelError(
                f"--model: cannot parse parameter {item!r} (known: "
                f"{', '.join(LlamaConfig.__slots__)})"
            )
        if key == "attention":
            fields[key] = value
        elif key == "capacity_factor":
            try:
                fields[key] = float(value)
            except ValueError:
                raise ModelError(
                    f"--model: parameter {key!r} needs a number, got {value!r}"
                ) from None
        else:
            fields[key] = _bounded(key, value)
    return replace(base, **fields)


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ModelError(f"--{name}: must be a positive integer, got {value!r}")


def _int_options(text: str, known: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in known:
            raise ModelError(f"--model: unknown field {key!r} (known: {', '.join(known)})")
        if not re.fullmatch(r"[0-9]+", value) or int(value) < 1:
            raise ModelError(f"--model: field {key!r} must be a positive integer, got {value!r}")
        out[key] = int(value)
    return out


def model_config(name: str, seq: int | None = None) -> GPTConfig | LlamaConfig | None:
    """The decoder configuration of a GPT- or LLaMA-family zoo name or parametric spec (None for
    other models), with ``seq`` applied."""
    family, sep, params = name.partition(":")
    cfg: GPTConfig | LlamaConfig | None = None
    if sep and family in PARAMETRIC:
        cfg = _parse_params(params, PARAMETRIC[family])
    elif sep and family in LLAMA_PARAMETRIC:
        cfg = _parse_llama(params, LLAMA_PARAMETRIC[family])
    elif not sep:
        cfg = LLAMA_PRESETS.get(name) or GPT_PRESETS.get(name)
    return replace(cfg, seq=seq) if cfg is not None and seq else cfg


def load_model(name: str, batch: int | None = None, seq: int | None = None) -> Graph:
    """Build a zoo model by name (or parametric spec) with optional global batch and sequence
    length."""
    _check_positive("batch", batch)
    _check_positive("seq", seq)
    if not isinstance(name, str):
        raise ModelError(f"--model: must be a string, got {name!r}")
    family, sep, params = name.partition(":")
    decoder = model_config(name, seq)
    if isinstance(decoder, LlamaConfig):
        return llama(decoder, batch or LM_BATCH, name=name)
    if isinstance(decoder, GPTConfig):
        return gpt(decoder, batch or LM_BATCH, name=name)
    if name in BERT_PRESETS:
        return bert(*BERT_PRESETS[name], batch=batch or LM_BATCH, seq=seq or 512, name=name)
    if name in VISION:
        return VISION[name](batch or VISION_BATCH)
    if name in ENCODERS:
        return ENCODERS[name](batch, seq)
    if sep and family in ("mlp", "transformer-block"):
        options = _int_options(
            params, {"mlp": ("hidden", "ffn"), "transformer-block": ("hidden", "heads")}[family]
        )
        if family == "mlp":
            return mlp(batch or 4096, options.get("hidden", 256), options.get("ffn", 0), name=name)
        return transformer_block(
            batch or LM_BATCH,
            seq or 1024,
            options.get("hidden", 1024),
            options.get("heads", 16),
            name=name,
        )
    if name == "mlp":
        return mlp(batch or 4096)
    if name == "transformer-block":
        return transformer_block(batch or LM_BATCH, seq or 1024)
    close = difflib.get_close_matches(
        name, model_names() + ["gpt:", "moe-gpt:", "llama:", "moe:"], n=1
    )
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ModelError(f"--model: unknown model {name!r}{hint} (see `planner models`)")
