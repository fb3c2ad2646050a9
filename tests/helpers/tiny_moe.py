"""Tiny mixture-of-experts checkpoints for tests, written by transformers itself: Qwen3-MoE, Mixtral and gpt-oss
shrunk to hidden 64 and 8 experts (top-2), in each layout their checkpoints ship in, plus a writer of gpt-oss's
released MXFP4 layout (``*_blocks`` / ``*_scales`` with a ``quantization_config``, as openai/gpt-oss-20b has it).

Layouts: ``per_expert`` (transformers' default save: ``experts.<e>.gate_proj.weight``, Mixtral's w1 / w3 / w2; for
gpt-oss its fused tensors, the only layout transformers writes for it), ``fused`` (``save_original_format=False``:
``experts.gate_up_proj`` [E, 2I, H]), ``mxfp4`` (gpt-oss: the experts quantized to MXFP4 in the released layout).

Example::

    path = make_tiny_moe_checkpoint(tmp_path / "qwen3-moe", "qwen3_moe")
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.tiny_models import make_tokenizer

FAMILIES = ("qwen3_moe", "mixtral", "gpt_oss")
LAYOUTS = ("per_expert", "fused", "mxfp4")
# what gpt-oss-20b's config.json says of its MXFP4 weights
MXFP4_QUANTIZATION_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                               "lm_head"],
}


def tiny_moe_config(family: str, *, vocab_size: int, layers: int = 2, sliding_window: int = 8):
    """A transformers config of ``family`` at hidden 64, 4 query / 2 KV heads of 16, 8 experts of 32, top-2.
    Qwen3-MoE: 3 layers by default with the middle one dense (``mlp_only_layers``) and ``norm_topk_prob``; gpt-oss:
    sliding and full attention alternating, the window ``sliding_window`` tokens."""
    import transformers

    common = dict(vocab_size=vocab_size, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  num_experts_per_tok=2, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, num_hidden_layers=max(layers, 3), intermediate_size=96,
                                           moe_intermediate_size=32, num_experts=8, norm_topk_prob=True,
                                           mlp_only_layers=[1], decoder_sparse_step=1, rope_theta=1000000.0)
    if family == "mixtral":
        return transformers.MixtralConfig(**common, num_hidden_layers=layers, intermediate_size=32,
                                          num_local_experts=8, rope_theta=1000000.0, sliding_window=None)
    if family == "gpt_oss":
        yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
                "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0}  # 8 x 64 = max_position_embeddings
        return transformers.GptOssConfig(**common, num_hidden_layers=layers, intermediate_size=32,
                                         num_local_experts=8, sliding_window=sliding_window, rope_parameters=yarn,
                                         layer_types=["sliding_attention", "full_attention"] * (layers // 2))
    raise ValueError(f"unknown MoE family {family!r}; choose from {FAMILIES}")


def make_tiny_moe_checkpoint(out: Path, family: str, *, layout: str = "per_expert", dtype: str = "float32",
                             seed: int = 0, **config) -> Path:
    """A random tiny ``family`` model with tokenizer files in ``out``, in ``layout`` (see the module docstring).
    Weights are drawn wider than transformers' init (std 0.15; biases, sinks and router biases too) so that
    routing and next-token distributions are not degenerate."""
    import torch
    import transformers

    if layout not in LAYOUTS or (layout == "mxfp4" and family != "gpt_oss"):
        raise ValueError(f"layout {layout!r} is not one of {family}'s")
    tokenizer = make_tokenizer()
    cfg = tiny_moe_config(family, vocab_size=len(tokenizer), **config)
    cfg.bos_token_id, cfg.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    cfg.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(getattr(torch, dtype)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
            elif name.endswith(("bias", "sinks")):
                p.normal_(0.0, 0.5 if name.endswith("sinks") else 0.1)
    out = Path(out)
    model.save_pretrained(out, safe_serialization=True, save_original_format=layout != "fused")
    tokenizer.save_pretrained(out)
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}
    (out / "generation_config.json").write_text(json.dumps(gen))
    if layout == "mxfp4":
        to_mxfp4_layout(out)
    return out


def to_mxfp4_layout(checkpoint: Path) -> Path:
    """Rewrite a transformers-written gpt-oss checkpoint in place in gpt-oss's released layout: each expert
    projection as MXFP4 ``<name>_blocks`` uint8 [E, rows, K / 32, 16] and ``<name>_scales`` uint8 [E, rows, K / 32]
    (rows: the output features, gate and up interleaved as transformers keeps them), a ``quantization_config`` in
    config.json. transformers reads it back dequantized (its CPU path without triton), to the same values."""
    from safetensors.torch import load_file, save_file

    from neuronpack.models import mxfp4

    for path in sorted(checkpoint.glob("*.safetensors")):
        tensors = {}
        for name, t in load_file(path).items():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):  # stored for x @ W: [E, K, rows]
                tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = mxfp4.quantize(t.transpose(1, 2))
            else:
                tensors[name] = t
        save_file(tensors, path, metadata={"format": "pt"})
    config_path = checkpoint / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = MXFP4_QUANTIZATION_CONFIG
    config_path.write_text(json.dumps(config, indent=2))
    return checkpoint
