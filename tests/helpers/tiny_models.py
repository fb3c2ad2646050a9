"""Tiny real checkpoints for tests: random transformers models with real configs shrunk to a few layers, and a
byte-level BPE tokenizer trained in-process (no hub access).

Example::

    path = make_tiny_checkpoint(tmp_path / "llama", arch="llama")
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
"""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Neuron compiles graphs ahead of time; buckets pad prompts to fixed lengths.",
    "Hello world! How are you today? I am fine, thank you.",
    "A recipe describes a build: model, target, buckets, sampling and quantization.",
    "user assistant system <|im_start|> <|im_end|> 0123456789",
] * 20

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

ARCHS = ("llama", "llama3", "mistral", "qwen2", "smollm", "qwen3", "gemma3")
GEMMA3_WINDOW = 8  # the tiny Gemma 3's sliding window: shorter than the tests' prompts and generations


def make_tokenizer(vocab_size: int = 384):
    """A byte-level BPE tokenizer trained on a small corpus, with ChatML special tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(arch: str = "llama", *, vocab_size: int, tie: bool | None = None, dtype: str = "float32",
                layers: int = 2, overrides: dict | None = None):
    """A transformers config of the given family, shrunk to 2 layers (``layers``) / hidden 64 (GQA: 4 query heads,
    2 KV); ``overrides``: config attributes set on top (e.g. a Mistral's ``sliding_window``)."""
    import transformers

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        torch_dtype=dtype,
    )
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=bool(tie))
    elif arch == "llama3":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64, "rope_theta": 500000.0}
        cfg = transformers.LlamaConfig(**common, rope_theta=500000.0, rope_scaling=rope,
                                       tie_word_embeddings=True if tie is None else tie)
    elif arch == "mistral":
        cfg = transformers.MistralConfig(**common, rope_theta=1000000.0, sliding_window=None,
                                         tie_word_embeddings=bool(tie))
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=bool(tie),
                                       use_sliding_window=False)
    elif arch == "qwen3":  # head_dim 16 of hidden 64 / 4 heads: explicit, as Qwen3's are
        cfg = transformers.Qwen3Config(**common, head_dim=16, rope_theta=1000000.0, tie_word_embeddings=bool(tie),
                                       use_sliding_window=False)
    elif arch == "gemma3":
        cfg = gemma3_config(common, tie=True if tie is None else tie)
    elif arch == "gemma2":  # not in ARCHS: Gemma 3's base, here for its soft-capped attention
        cfg = transformers.Gemma2Config(**{**common, "rms_norm_eps": 1e-6}, head_dim=16, query_pre_attn_scalar=24,
                                        sliding_window=GEMMA3_WINDOW, tie_word_embeddings=True if tie is None else tie)
    elif arch == "smollm":
        # SmolLM2 is a Llama with tied embeddings and 3:1 grouped-query attention.
        cfg = transformers.LlamaConfig(**{**common, "num_attention_heads": 6, "num_key_value_heads": 2,
                                          "hidden_size": 48}, rope_theta=100000.0,
                                       tie_word_embeddings=True if tie is None else tie)
    else:
        raise ValueError(f"unknown tiny arch {arch!r}; choose from {ARCHS}")
    for key, value in (overrides or {}).items():
        setattr(cfg, key, value)
    return cfg


def gemma3_config(common: dict, *, tie: bool, **overrides):
    """A Gemma 3 text config: sliding layers (window ``GEMMA3_WINDOW``, rope theta 10k) and a last global layer
    (theta 1M, linear rope scaling as Gemma 3 4B+), head_dim 16 with query_pre_attn_scalar 24 (not head_dim, so the
    scale is exercised)."""
    import transformers

    layers = common["num_hidden_layers"]
    layer_types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    return transformers.Gemma3TextConfig(**{**common, "rms_norm_eps": 1e-6}, head_dim=16, query_pre_attn_scalar=24,
                                         sliding_window=GEMMA3_WINDOW, layer_types=layer_types,
                                         rope_scaling={"rope_type": "linear", "factor": 8.0},
                                         tie_word_embeddings=tie, **overrides)


def make_tiny_checkpoint(
    out: Path,
    arch: str = "llama",
    *,
    dtype: str = "float32",
    tie: bool | None = None,
    max_shard_size: str | None = None,
    seed: int = 0,
    layers: int = 2,
    overrides: dict | None = None,
) -> Path:
    """Write a random tiny model of ``arch`` with tokenizer files to ``out`` (safetensors; sharded if asked);
    ``overrides``: config attributes (see ``tiny_config``)."""
    import torch
    import transformers

    tokenizer = make_tokenizer()
    cfg = tiny_config(arch, vocab_size=len(tokenizer), tie=tie, dtype=dtype, layers=layers, overrides=overrides)
    cfg.bos_token_id = tokenizer.bos_token_id
    cfg.eos_token_id = tokenizer.eos_token_id
    cfg.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    model = model.to(getattr(torch, dtype)).eval()
    # Larger-than-default init so random models have peaked (non-degenerate) next-token distributions.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    out = Path(out)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, safe_serialization=True, **kwargs)
    tokenizer.save_pretrained(out)
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}
    (out / "generation_config.json").write_text(json.dumps(gen))
    return out


def fine_tune_copy(src: Path, out: Path, *, scale: float = 1.01, seed: int = 1) -> Path:
    """A "fine-tune" of the checkpoint ``src`` in ``out``: every floating tensor's values changed (multiplied by
    ``scale`` and nudged by seeded noise of 1% of its std), names / dtypes / shapes, config and tokenizer as they
    are. (bench/compile_reuse.py makes SmolLM2's fine-tune with it too.)"""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out = Path(out)
    shutil.copytree(src, out)
    gen = torch.Generator().manual_seed(seed)
    for path in sorted(out.glob("*.safetensors")):
        tensors = load_file(path)
        for name, t in tensors.items():
            if t.is_floating_point():
                f = t.float()
                noise = torch.randn(f.shape, generator=gen) * 0.01 * (f.std() if f.numel() > 1 else 1.0)
                tensors[name] = (f * scale + noise).to(t.dtype).contiguous()
        save_file(tensors, path, metadata={"format": "pt"})
    return out
