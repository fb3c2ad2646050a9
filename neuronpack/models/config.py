"""The portable model's configuration, read from a Hugging Face ``config.json`` dict (torch-free).

Supported families share one forward: llama (incl. llama3 rope scaling, SmolLM), mistral without an active sliding
window, qwen2 (q/k/v projections with bias). Anything else raises ``UnsupportedModelError`` naming the field.

Example::

    cfg = ModelConfig.from_hf(json.loads(Path("model/config.json").read_text()))
    cfg.num_kv_heads, cfg.head_dim      # (3, 64) for SmolLM2-135M
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from neuronpack.errors import UnsupportedModelError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of a Llama-family decoder. ``rope`` holds the rope parameters (rope_type, rope_theta,
    and for llama3: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    rope: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    sliding_window: int | None = None

    @property
    def queries_per_kv(self) -> int:
        """Query heads sharing one KV head (grouped-query attention fold factor)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, hf: dict[str, Any], *, max_seq_len: int | None = None) -> ModelConfig:
        """Build from an HF config dict. ``max_seq_len`` lets a sliding-window model through when the compiled
        length never exceeds the window (attention is then identical to full attention)."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported by the portable backend",
                where="config.json model_type",
                fix=f"use a {' / '.join(SUPPORTED_MODEL_TYPES)} family checkpoint",
            )
        heads = int(hf["num_attention_heads"])
        kv_heads = int(hf.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
                where="config.json",
                fix="check the checkpoint's config",
            )
        if hf.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(
                f"hidden_act {hf['hidden_act']!r} is not supported", where="config.json hidden_act", fix="use silu"
            )
        attention_bias = bool(hf.get("attention_bias", False))
        qwen = model_type == "qwen2"
        return cls(
            model_type=model_type,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            # qwen2 always has q/k/v bias and no o_proj bias; llama's attention_bias covers all four projections.
            qkv_bias=qwen or attention_bias,
            o_bias=attention_bias and not qwen,
            mlp_bias=bool(hf.get("mlp_bias", False)),
            rope=_rope_parameters(hf),
            sliding_window=_active_sliding_window(hf, max_seq_len),
        )


def _rope_parameters(hf: dict[str, Any]) -> dict[str, Any]:
    """Normalise transformers 4.x (rope_theta + rope_scaling) and 5.x (rope_parameters) spellings."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    rope_type = params.get("rope_type") or params.get("type") or "default"
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope type {rope_type!r} is not supported",
            where="config.json rope_parameters / rope_scaling",
            fix=f"use one of {', '.join(SUPPORTED_ROPE_TYPES)}",
        )
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModelError(
            "partial rotary embeddings are not supported", where="config.json partial_rotary_factor"
        )
    out: dict[str, Any] = {"rope_type": rope_type, "rope_theta": float(theta)}
    if rope_type == "linear":
        out["factor"] = float(params["factor"])
    if rope_type == "llama3":
        for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in params:
                raise UnsupportedModelError(
                    f"llama3 rope scaling is missing {key!r}", where="config.json rope_parameters", fix="add it"
                )
            out[key] = float(params[key])
    return out


def _active_sliding_window(hf: dict[str, Any], max_seq_len: int | None) -> int | None:
    window = hf.get("sliding_window")
    if hf.get("model_type") == "qwen2" and not hf.get("use_sliding_window", False):
        window = None
    if window is None or window >= int(hf.get("max_position_embeddings", math.inf)):
        return None
    if max_seq_len is not None and max_seq_len <= window:
        return None  # never reached: full attention is exact
    raise UnsupportedModelError(
        f"sliding-window attention (window {window}) is not supported",
        where="config.json sliding_window",
        fix=f"compile with target.seq_len <= {window}, or use a checkpoint without a sliding window",
    )
