"""The model of a Megatron-LM line (``planner evaluate --from-megatron``): the zoo configuration its
flags describe, with Megatron-LM's defaults (``megatron/training/arguments.py``: the ffn size, the
tokenizer's vocabulary and its padding), and a model the zoo refuses reported by the line's flag."""

from __future__ import annotations

import math

from planner.errors import ModelError, SettingsError
from planner.zoo import MAX_LAYERS, GPTConfig, LlamaConfig


def line_model(args, tp: int) -> GPTConfig | LlamaConfig:
    """The zoo model of the line; the vocabulary padded as Megatron pads it."""
    if args.num_layers > MAX_LAYERS:
        raise SettingsError(
            f"--from-megatron: --num-layers: at most {MAX_LAYERS}, got {args.num_layers}"
        )
    head = args.hidden_size // args.num_attention_heads  # arguments.py's default kv_channels
    if args.kv_channels is not None and args.kv_channels != head:
        raise SettingsError(
            f"--from-megatron: --kv-channels {args.kv_channels}: a head size other than "
            f"--hidden-size / --num-attention-heads ({head}) is not modelled"
        )
    step = args.make_vocab_size_divisible_by * tp
    vocab = math.ceil(_vocabulary(args) / step) * step
    ffn = args.ffn_hidden_size or _default_ffn(args)
    layers, hidden, heads = args.num_layers, args.hidden_size, args.num_attention_heads
    # Megatron-LM's default backend (auto) runs a fused kernel (flash or cuDNN) where one applies
    attention = "explicit" if args.attention_backend in ("unfused", "local") else "fused"
    if args.swiglu or args.normalization == "RMSNorm" or args.position_embedding_type == "rope":
        llama = args.swiglu and args.normalization == "RMSNorm"
        if not (llama and args.position_embedding_type == "rope" and args.disable_bias_linear):
            raise SettingsError(
                "--from-megatron: a LLaMA-style model needs --swiglu --normalization RMSNorm "
                "--position-embedding-type rope --disable-bias-linear together"
            )
        # Megatron-LM's --num-query-groups defaults to 1 (one shared key/value head)
        kv = (args.num_query_groups or 1) if args.group_query_attention else heads
        return _config(
            LlamaConfig,
            layers, hidden, heads, kv or heads, ffn, args.seq_length, vocab, attention=attention,
        )  # fmt: skip
    dropout = int(args.attention_dropout > 0 or args.hidden_dropout > 0)
    return _config(
        GPTConfig,
        layers, hidden, heads, args.seq_length, vocab, ffn, dropout=dropout, attention=attention,
    )  # fmt: skip


# the zoo's fields as the line spells them (a model the zoo refuses names the line's flag)
ZOO_FLAGS = {
    "layers": "--num-layers",
    "hidden": "--hidden-size",
    "heads": "--num-attention-heads",
    "kv_heads": "--num-query-groups",
    "ffn": "--ffn-hidden-size",
    "seq": "--seq-length",
    "vocab": "--vocab-size",
}


def _config(kind, *values, **options):
    """The zoo configuration of the line; a ModelError names the flag of the field it refuses."""
    try:
        return kind(*values, **options)
    except ModelError as error:
        text = str(error).removeprefix("--model: ")
        field = text.split("'")[1] if text.startswith("field '") else ""
        flag = ZOO_FLAGS.get(field, "the model")
        raise SettingsError(f"--from-megatron: {flag}: {text}") from None


# tokenizers whose vocabulary is fixed (Megatron-LM's megatron/training/tokenizer): GPT-2's BPE
# (50,257), LLaMA 2's SentencePiece model (32,000); HuggingFace models of the zoo by name
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000}
MODEL_VOCAB = (("llama-3", 128256), ("llama3", 128256), ("llama-2", 32000), ("gpt2", 50257))


def _default_ffn(args) -> int:
    """Megatron-LM's --ffn-hidden-size default: 4h, or with --swiglu 2/3 of it rounded down to a
    multiple of 64 (arguments.py)."""
    if args.swiglu:
        return int((4 * args.hidden_size * 2 / 3) / 64) * 64
    return 4 * args.hidden_size


def _vocabulary(args) -> int:
    """The unpadded vocabulary: --vocab-size, else the tokenizer's where it is known (a line with
    no --tokenizer-type is read with GPT-2's, the default of the 2020-2022 scripts); otherwise the
    line is refused."""
    if args.vocab_size:
        return args.vocab_size
    kind = args.tokenizer_type or "GPT2BPETokenizer"
    if kind in TOKENIZER_VOCAB:
        return TOKENIZER_VOCAB[kind]
    name = (args.tokenizer_model or "").lower()
    known = [size for key, size in MODEL_VOCAB if key in name]
    if kind == "HuggingFaceTokenizer" and known:
        return known[0]
    raise SettingsError(
        f"--vocab-size: give it (the vocabulary of --tokenizer-type {kind} "
        f"{args.tokenizer_model or ''} is not known to the planner)"
    )
