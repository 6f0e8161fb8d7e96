"""Built-in PyTorch models for ``planner import-torch``: transformers configs, or a user's file.

``hf:gpt2[:layers=12,hidden=768,heads=12,seq=1024,vocab=50257,batch=1]`` and
``hf:resnet50[:batch=8,image=224,classes=1000]`` build the models from ``transformers`` configs (no
weights are downloaded); ``file.py:function`` calls a function returning ``(module, example_inputs)``.
"""

from __future__ import annotations

from planner.engines.torch_import import TorchImportError


def _options(text: str, where: str) -> dict[str, int]:
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if not value.isdigit() or int(value) < 1:
            raise TorchImportError(f"{where}: option {part!r} must be key=positive integer")
        out[key.strip()] = int(value)
    return out


def build_spec(spec: str):
    """(module, example inputs, name) for ``hf:gpt2[:opts]``, ``hf:resnet50[:opts]`` or ``file.py:function``.

    hf:gpt2 options: layers, hidden, heads, seq, vocab, batch (GPT-2 small defaults, batch 1, seq 1024);
    hf:resnet50 options: batch (8), image (224), classes (1000). Configs only: no weights are downloaded."""
    import torch
    family, _, rest = spec.partition(":")
    if family == "hf":
        model, _, opts = rest.partition(":")
        where = f"import-torch {spec}"
        o = _options(opts, where)
        if model == "gpt2":
            from transformers import GPT2Config, GPT2LMHeadModel
            seq = o.get("seq", 1024)
            cfg = GPT2Config(n_layer=o.get("layers", 12), n_embd=o.get("hidden", 768), n_head=o.get("heads", 12),
                             n_positions=max(seq, 1024), vocab_size=o.get("vocab", 50257), use_cache=False,
                             attn_implementation="eager", bos_token_id=None, eos_token_id=None)
            return GPT2LMHeadModel(cfg), (torch.zeros(o.get("batch", 1), seq, dtype=torch.long),), "gpt2-torch"
        if model == "resnet50":
            from transformers import ResNetConfig, ResNetForImageClassification
            cfg = ResNetConfig(num_labels=o.get("classes", 1000))
            image = o.get("image", 224)
            return ResNetForImageClassification(cfg), (torch.zeros(o.get("batch", 8), 3, image, image),), "resnet50-torch"
        raise TorchImportError(f"{where}: unknown preset {model!r} (known: hf:gpt2, hf:resnet50)")
    path, _, function = spec.rpartition(":")
    if not path.endswith(".py") or not function:
        raise TorchImportError(f"import-torch: SPEC must be hf:gpt2, hf:resnet50 or file.py:function, got {spec!r}")
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
