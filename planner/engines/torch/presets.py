"""Built-in PyTorch models for ``planner import-torch``: transformers configs, or a user's file.

``hf:gpt2[:layers=12,hidden=768,heads=12,seq=1024,vocab=50257,batch=1]`` and
``hf:resnet50[:batch=8,image=224,classes=1000]`` build the models from ``transformers`` configs (no
weights are downloaded); so do the small defaults of ``hf:llama``, ``hf:mixtral``, ``hf:vit``,
``hf:t5`` and ``hf:bert`` (options below, in ``SMALL``); ``file.py:function`` calls a function
returning ``(module, example_inputs)``.
"""

from __future__ import annotations

from planner.engines.torch.importer import TorchImportError
from planner.engines.torch.importer.state import failure
from planner.errors import PlannerError
from planner.engines.torch.importer import import_module
from planner.errors import SettingsError


def _options(text: str, where: str, known: tuple[str, ...]) -> dict[str, int]:
    """``key=value,...`` with each key one of ``known``, given once, and a positive integer
    value."""
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in known:
            raise TorchImportError(f"{where}: unknown option {key!r} (known: {', '.join(known)})")
        if key in out:
            raise TorchImportError(f"{where}: option {key!r} given twice")
        if not value.isdigit() or int(value) < 1:
            raise TorchImportError(f"{where}: option {part!r} must be key=positive integer")
        out[key] = int(value)
    return out


GPT2_OPTIONS = ("layers", "hidden", "heads", "seq", "vocab", "batch")
RESNET_OPTIONS = ("batch", "image", "classes")


def preset_options(model: str) -> tuple[str, ...]:
    """The option keys an ``hf:MODEL`` preset takes (empty for an unknown preset)."""
    return {"gpt2": GPT2_OPTIONS, "resnet50": RESNET_OPTIONS}.get(model) or tuple(
        SMALL.get(model, ())
    )


def build_spec(spec: str):
    """``_build_spec`` with every error of the user's code or configuration as one
    ``TorchImportError`` line (a syntax error, a factory that raises, a preset that transformers
    refuses such as ``hf:gpt2:heads=5``)."""
    try:
        return _build_spec(spec)
    except PlannerError:
        raise
    # the user's file or the library's config check: named, not a traceback
    except Exception as exc:
        raise TorchImportError(f"import-torch {spec}: {failure(exc)}") from None


def _build_spec(spec: str):
    """(module, example inputs, name) for ``hf:gpt2[:opts]``, ``hf:resnet50[:opts]`` or
    ``file.py:function``.

    hf:gpt2 options: layers, hidden, heads, seq, vocab, batch (GPT-2 small defaults, batch 1, seq
    1024); hf:resnet50 options: batch (8), image (224), classes (1000). Configs only: no weights are
    downloaded."""
    import torch

    family, _, rest = spec.partition(":")
    if family == "hf":
        model, _, opts = rest.partition(":")
        where = f"import-torch {spec}"
        known = preset_options(model)
        o = _options(opts, where, known) if known else {}
        if model == "gpt2":
            return _gpt2(o, torch)
        if model == "resnet50":
            from transformers import ResNetConfig, ResNetForImageClassification

            cfg = ResNetConfig(num_labels=o.get("classes", 1000))
            image = o.get("image", 224)
            return (
                ResNetForImageClassification(cfg),
                (torch.zeros(o.get("batch", 8), 3, image, image),),
                "resnet50-torch",
            )
        if model in SMALL:
            return _small(model, {**SMALL[model], **o}, torch)
        raise TorchImportError(
            f"{where}: unknown preset {model!r} (known: hf:gpt2, hf:resnet50, "
            f"{', '.join('hf:' + k for k in SMALL)})"
        )
    return _user_function(spec)


def _gpt2(o: dict, torch):
    """Hugging Face's GPT-2 from a config (no weights), with a batch of token ids."""
    from transformers import GPT2Config, GPT2LMHeadModel

    seq = o.get("seq", 1024)
    cfg = GPT2Config(
        n_layer=o.get("layers", 12),
        n_embd=o.get("hidden", 768),
        n_head=o.get("heads", 12),
        n_positions=max(seq, 1024),
        vocab_size=o.get("vocab", 50257),
        use_cache=False,
        attn_implementation="eager",
        bos_token_id=None,
        eos_token_id=None,
    )
    return (
        GPT2LMHeadModel(cfg),
        (torch.zeros(o.get("batch", 1), seq, dtype=torch.long),),
        "gpt2-torch",
    )


def _user_function(spec: str):
    """(module, example inputs, name) from ``file.py:function``."""
    path, _, function = spec.rpartition(":")
    if not path.endswith(".py") or not function:
        raise TorchImportError(
            f"import-torch: SPEC must be hf:gpt2, hf:resnet50 or file.py:function, got {spec!r}"
        )
    import importlib.util

    loader = importlib.util.spec_from_file_location("planner_user_module", path)
    if loader is None:
        raise TorchImportError(f"import-torch: cannot load {path}")
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except OSError as exc:
        raise TorchImportError(f"import-torch: cannot read {path} ({exc.strerror})") from None
    if not hasattr(module, function):
        raise TorchImportError(f"import-torch: {path} has no function {function!r}")
    built = getattr(module, function)()
    return built[0], tuple(built[1]), function


# Small defaults (override any with key=value): layers, hidden, heads, ..., batch, seq.
SMALL = {
    "llama": {
        "layers": 2,
        "hidden": 128,
        "heads": 4,
        "kv_heads": 2,
        "ffn": 256,
        "vocab": 512,
        "seq": 64,
        "batch": 2,
    },
    "mixtral": {
        "layers": 2,
        "hidden": 128,
        "heads": 4,
        "kv_heads": 2,
        "ffn": 256,
        "vocab": 512,
        "seq": 64,
        "batch": 2,
        "experts": 4,
        "top_k": 2,
    },
    "vit": {
        "layers": 2,
        "hidden": 128,
        "heads": 4,
        "mlp": 256,
        "image": 32,
        "patch": 8,
        "classes": 10,
        "batch": 2,
    },
    "t5": {
        "layers": 2,
        "hidden": 128,
        "heads": 4,
        "head_dim": 32,
        "ffn": 256,
        "vocab": 512,
        "seq": 32,
        "batch": 2,
    },
    "bert": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 1024, "seq": 64, "batch": 2},
}


def _decoder(model: str, o: dict[str, int], hf, ids):
    """LLaMA or Mixtral (its MoE options on top of LLaMA's) from a config, with a batch of ids."""
    common = dict(
        num_hidden_layers=o["layers"],
        hidden_size=o["hidden"],
        num_attention_heads=o["heads"],
        num_key_value_heads=o["kv_heads"],
        intermediate_size=o["ffn"],
        vocab_size=o["vocab"],
        max_position_embeddings=o["seq"],
        use_cache=False,
        attn_implementation="sdpa",
    )
    if model == "llama":
        return hf.LlamaForCausalLM(hf.LlamaConfig(**common)), (ids,), "llama-torch"
    cfg = hf.MixtralConfig(**common, num_local_experts=o["experts"], num_experts_per_tok=o["top_k"])
    return hf.MixtralForCausalLM(cfg), (ids,), "mixtral-torch"


def _small(model: str, o: dict[str, int], torch):
    """The small Hugging Face models from their configs (no weights), with example inputs."""
    import transformers as hf

    ids = torch.zeros(o["batch"], o.get("seq", 1), dtype=torch.long)
    if model in ("llama", "mixtral"):
        return _decoder(model, o, hf, ids)
    if model == "vit":
        cfg = hf.ViTConfig(
            num_hidden_layers=o["layers"],
            hidden_size=o["hidden"],
            num_attention_heads=o["heads"],
            intermediate_size=o["mlp"],
            image_size=o["image"],
            patch_size=o["patch"],
            num_labels=o["classes"],
            attn_implementation="sdpa",
        )
        images = torch.zeros(o["batch"], 3, o["image"], o["image"])
        return hf.ViTForImageClassification(cfg), (images,), "vit-torch"
    if model == "t5":
        cfg = hf.T5Config(
            num_layers=o["layers"],
            num_decoder_layers=o["layers"],
            d_model=o["hidden"],
            num_heads=o["heads"],
            d_kv=o["head_dim"],
            d_ff=o["ffn"],
            vocab_size=o["vocab"],
            use_cache=False,
            decoder_start_token_id=0,
        )
        return _encoder_decoder(hf.T5ForConditionalGeneration(cfg)), (ids, ids), "t5-torch"
    cfg = hf.BertConfig(
        num_hidden_layers=o["layers"],
        hidden_size=o["hidden"],
        num_attention_heads=o["heads"],
        intermediate_size=4 * o["hidden"],
        vocab_size=o["vocab"],
        max_position_embeddings=o["seq"],
    )
    return hf.BertForMaskedLM(cfg), (ids,), "bert-torch"


def _encoder_decoder(model):
    """The model with positional (input_ids, decoder_input_ids), returning the LM logits
    (torch.export)."""
    import torch

    class EncoderDecoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, decoder_input_ids):
            return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits

    return EncoderDecoder()


def import_spec(spec: str, loss: str = "sum", allow_unknown: bool = False):
    """The graph of a preset or ``file.py:function`` (see ``build_spec``), imported through
    ``torch.export`` with the training ``loss`` (``sum`` or ``cross_entropy``)."""
    module, inputs, name = build_spec(spec)
    return import_module(module, inputs, name=name, allow_unknown=allow_unknown, loss=loss)


def imported_loader(path: str, seq: int | None = None):
    """For a graph JSON that ``import-torch`` wrote from a preset: ``batch -> graph`` re-imported at
    that batch (and ``seq``), as pipeline planning and 3D runs rebuild the model per micro-batch."""
    import json
    from pathlib import Path

    try:
        source = json.loads(Path(path).read_text()).get("torch_module")
    except (OSError, ValueError, AttributeError):
        source = None
    spec = str(source.get("spec", "")) if isinstance(source, dict) else ""
    if not spec.startswith("hf:"):
        raise SettingsError(
            f"--model: {path}: pipeline planning re-builds the model per micro-batch: give a zoo "
            "model or a graph that import-torch wrote from an hf: preset"
        )
    family, model, opts = (spec.split(":", 2) + [""])[:3]
    base = _options(opts, f"--model {path}", preset_options(model))

    def load(batch: int):
        options = {**base, "batch": batch, **({"seq": seq} if seq else {})}
        return import_spec(
            f"{family}:{model}:" + ",".join(f"{k}={v}" for k, v in options.items()),
            source.get("loss", "sum"),
        )

    return load
