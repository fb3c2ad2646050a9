"""bench/moe.py's inputs: random-weight checkpoints of two MoE shapes, written as their releases ship (Qwen3-MoE's
experts per expert in bfloat16, gpt-oss's experts in MXFP4 ``*_blocks`` / ``*_scales``), with SmolLM2's tokenizer
(llama.cpp's converter knows it), one safetensors shard per layer (never more than a layer in memory); and the bytes
a decode step reads from an artifact or a GGUF: every tensor but the embedding table, the experts' at k / E (the
share a token routes to).

Shapes (their released config.json, fewer layers: ``--layers``):

* ``qwen3-30b-a3b``: Qwen3-30B-A3B, hidden 2048, 32 query / 4 KV heads of 128, all 128 experts of 768, top 8;
* ``gpt-oss-20b``: gpt-oss-20b, hidden 2880, 64 query / 8 KV heads of 64, 32 experts of 2880, top 4, sliding (128)
  and full layers alternating, attention sinks, YaRN; the experts in MXFP4.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench._peers_inputs import write_checkpoint

QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 40960, "hidden_act": "silu", "attention_bias": False,
    "tie_word_embeddings": False, "use_sliding_window": False, "torch_dtype": "bfloat16",
}
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
    "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4, "num_hidden_layers": 24,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128,
    "rope_theta": 150000, "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                           "truncate": False, "original_max_position_embeddings": 4096},
    "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "hidden_act": "silu", "attention_bias": True,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
}
SHAPES = {"qwen3-30b-a3b": QWEN3_30B_A3B, "gpt-oss-20b": GPT_OSS_20B}
STD = 0.02


def moe_checkpoint(shape: str, layers: int, tokenizer_dir: Path, out: Path, seed: int = 0) -> Path:
    """The random checkpoint of ``shape`` with ``layers`` layers in ``out`` (reused when complete)."""
    import torch

    if (out / "model.safetensors.index.json").is_file():
        return out
    config = dict(SHAPES[shape], num_hidden_layers=layers)
    tokenizer = json.loads((tokenizer_dir / "config.json").read_text())
    config.update({k: tokenizer[k] for k in ("vocab_size", "bos_token_id", "eos_token_id") if k in tokenizer})
    if shape == "gpt-oss-20b":
        config["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    gen = torch.Generator().manual_seed(seed)
    h = config["hidden_size"]

    def normal(*shape: int, std: float = STD) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).bfloat16()

    def shards():  # one at a time: a layer of Qwen3-30B-A3B's experts is 1.2 GB
        yield "embed", {"model.embed_tokens.weight": normal(config["vocab_size"], h),
                        "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
                        "lm_head.weight": normal(config["vocab_size"], h)}
        layer = _qwen3_moe_layer if shape == "qwen3-30b-a3b" else _gpt_oss_layer
        for i in range(layers):
            yield f"layer{i:02d}", layer(config, f"model.layers.{i}.", normal)

    return write_checkpoint(out, layers + 1, shards(), config, tokenizer_dir)


def _attention(config: dict, p: str, normal, bias: bool) -> dict:
    import torch

    h, hd = config["hidden_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    out = {f"{p}self_attn.q_proj.weight": normal(q, h), f"{p}self_attn.k_proj.weight": normal(kv, h),
           f"{p}self_attn.v_proj.weight": normal(kv, h), f"{p}self_attn.o_proj.weight": normal(h, q),
           f"{p}input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
           f"{p}post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16)}
    if bias:
        out.update({f"{p}self_attn.{n}_proj.bias": normal(size) for n, size in (("q", q), ("k", kv), ("v", kv),
                                                                                ("o", h))})
    return out


def _qwen3_moe_layer(config: dict, p: str, normal) -> dict:
    import torch

    h, i, hd = config["hidden_size"], config["moe_intermediate_size"], config["head_dim"]
    out = _attention(config, p, normal, bias=False)
    out.update({f"{p}self_attn.q_norm.weight": torch.ones(hd, dtype=torch.bfloat16),
                f"{p}self_attn.k_norm.weight": torch.ones(hd, dtype=torch.bfloat16),
                f"{p}mlp.gate.weight": normal(config["num_experts"], h)})
    for e in range(config["num_experts"]):
        out.update({f"{p}mlp.experts.{e}.gate_proj.weight": normal(i, h),
                    f"{p}mlp.experts.{e}.up_proj.weight": normal(i, h),
                    f"{p}mlp.experts.{e}.down_proj.weight": normal(h, i)})
    return out


def _gpt_oss_layer(config: dict, p: str, normal) -> dict:
    from neuronpack.models import mxfp4

    h, i, e = config["hidden_size"], config["intermediate_size"], config["num_local_experts"]
    out = _attention(config, p, normal, bias=True)
    out.update({f"{p}self_attn.sinks": normal(config["num_attention_heads"], std=1.0),
                f"{p}mlp.router.weight": normal(e, h), f"{p}mlp.router.bias": normal(e),
                f"{p}mlp.experts.gate_up_proj_bias": normal(e, 2 * i), f"{p}mlp.experts.down_proj_bias": normal(e, h)})
    for name, rows, k in (("gate_up_proj", 2 * i, h), ("down_proj", h, i)):  # [E, rows (out features), K]
        out[f"{p}mlp.experts.{name}_blocks"], out[f"{p}mlp.experts.{name}_scales"] = mxfp4.quantize(normal(e, rows, k))
    return out


def step_bytes(sizes: dict[str, int], *, experts: int, per_token: int, expert_marker: str, embedding: str,
               head: str) -> dict[str, int]:
    """A decode step's weight bytes: every tensor but the embedding table (one row per token) unless it is the
    head; the experts' (names containing ``expert_marker``) at ``per_token`` / ``experts``, the routed share.
    Returns {"active": ..., "experts_all": ..., "total": ...}."""
    if head in sizes:
        sizes = {n: b for n, b in sizes.items() if n != embedding}
    expert = sum(b for n, b in sizes.items() if expert_marker in n)
    rest = sum(b for n, b in sizes.items() if expert_marker not in n)
    return {"active": rest + expert * per_token // experts, "experts_all": expert, "total": rest + expert}


def artifact_sizes(artifact: Path) -> dict[str, int]:
    """Tensor name -> bytes of an artifact's weights."""
    from safetensors import safe_open

    from bench._peers_inputs import _DTYPE_BYTES, _numel

    sizes = {}
    for file in sorted((artifact / "weights").glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                sl = f.get_slice(name)
                sizes[name] = _numel(sl.get_shape()) * _DTYPE_BYTES[sl.get_dtype()]
    return sizes


def gguf_sizes(path: Path) -> dict[str, int]:
    """Tensor name -> bytes of a GGUF file."""
    from gguf import GGUFReader

    return {t.name: int(t.n_bytes) for t in GGUFReader(str(path)).tensors}
