"""The portable model's configuration, read from a Hugging Face ``config.json`` dict (torch-free).

``ModelConfig.from_hf`` hands the dict to its family (models/registry.py: model_type -> a module of
models/families/), which reads what it knows and refuses the rest with an ``UnsupportedModelError`` naming the field.
Beyond the shapes every decoder has, a config says per layer which attention it runs (``layer_types``: HF's names,
``full_attention`` or ``sliding_attention``), which rope each attention kind uses (``rope_for``) and which FFN
(``ffn_types``); and the few numbers some families set (query scale, soft-capping). The helpers below are the
parsing the families share.

Example::

    cfg = ModelConfig.from_hf(json.loads(Path("model/config.json").read_text()))
    cfg.num_kv_heads, cfg.head_dim      # (3, 64) for SmolLM2-135M
    cfg.layer_kind(0)                   # "full_attention"
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from neuronpack.errors import UnsupportedModelError

FULL, SLIDING = "full_attention", "sliding_attention"  # attention kinds: HF's ``layer_types`` names
DENSE = "dense"  # the one FFN kind dense families have (MoE families add theirs)
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of a decoder. ``rope`` holds the rope parameters of full-attention layers (rope_type,
    rope_theta, and the type's: llama3's factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings; linear's factor); ``local_rope`` those of sliding-window layers when they
    differ (Gemma 3's ``rope_local_base_freq``). ``layer_types`` / ``ffn_types``: one entry per layer, () when every
    layer is full attention / dense."""

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
    sliding_window: int | None = None  # positions a sliding-window layer attends to (itself included)
    family: str = "llama"  # the module of models/families/ that builds it (models/registry.py)
    layer_types: tuple[str, ...] = ()
    local_rope: dict[str, Any] | None = None
    ffn_types: tuple[str, ...] = ()
    hidden_act: str = "silu"  # the gated MLP's activation: silu, or gelu_pytorch_tanh (GeGLU)
    query_scale: float | None = None  # scores are q.k * this; None: head_dim ** -0.5
    attn_softcap: float | None = None  # scores -> tanh(scores / cap) * cap before the mask
    final_softcap: float | None = None  # logits -> tanh(logits / cap) * cap

    @property
    def queries_per_kv(self) -> int:
        """Query heads sharing one KV head (grouped-query attention fold factor)."""
        return self.num_heads // self.num_kv_heads

    @property
    def scale(self) -> float:
        """The attention scores' scale."""
        return self.query_scale if self.query_scale is not None else 1.0 / math.sqrt(self.head_dim)

    def layer_kind(self, index: int) -> str:
        """Layer ``index``'s attention kind: FULL or SLIDING."""
        return self.layer_types[index] if self.layer_types else FULL

    def ffn_kind(self, index: int) -> str:
        """Layer ``index``'s FFN kind (DENSE for the dense families)."""
        return self.ffn_types[index] if self.ffn_types else DENSE

    def window(self, kind: str) -> int | None:
        """The positions a layer of attention ``kind`` attends to (None: every position before it)."""
        return self.sliding_window if kind == SLIDING else None

    def rope_for(self, kind: str) -> dict[str, Any]:
        """The rope parameters of attention ``kind``'s layers."""
        return self.local_rope if kind == SLIDING and self.local_rope is not None else self.rope

    def attention_kinds(self) -> tuple[str, ...]:
        """The attention kinds the layers use, each once, in order of first use."""
        return tuple(dict.fromkeys(self.layer_kind(i) for i in range(self.num_layers)))

    @classmethod
    def from_hf(cls, hf: dict[str, Any], *, max_seq_len: int | None = None) -> ModelConfig:
        """Build from an HF config dict through its family (models/registry.py). ``max_seq_len``: the longest
        sequence compiled (a window no sequence passes is full attention)."""
        from neuronpack.models.registry import family_for

        return family_for(hf).config_from_hf(hf, max_seq_len=max_seq_len)


def attention_heads(hf: dict[str, Any]) -> tuple[int, int]:
    """(query heads, KV heads), checked to fold (query heads a multiple of KV heads)."""
    heads = int(hf["num_attention_heads"])
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise UnsupportedModelError(
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
            where="config.json",
            fix="check the checkpoint's config",
        )
    return heads, kv_heads


def shapes(hf: dict[str, Any], model_type: str, family: str) -> dict[str, Any]:
    """The ModelConfig fields every decoder's config.json spells alike."""
    heads, kv_heads = attention_heads(hf)
    return dict(
        model_type=model_type,
        family=family,
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
    )


def activation(hf: dict[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    """The activation config.json names under ``key``, refused unless ``allowed``."""
    act = hf.get(key) or default
    if act not in allowed:
        raise UnsupportedModelError(f"{key} {act!r} is not supported", where=f"config.json {key}",
                                    fix=f"use {' or '.join(allowed)}")
    return act


def declared_layer_types(hf: dict[str, Any], layers: int) -> tuple[str, ...] | None:
    """config.json's ``layer_types`` (transformers 5 writes it), checked; None when it has none."""
    declared = hf.get("layer_types")
    if not declared:
        return None
    if len(declared) != layers or set(declared) - {FULL, SLIDING}:
        raise UnsupportedModelError(f"layer_types {declared!r} is not {layers} of {FULL} / {SLIDING}",
                                    where="config.json layer_types", fix="check the checkpoint's config")
    return tuple(declared)


def rope_parameters(hf: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Normalise transformers 4.x (rope_theta + rope_scaling) and 5.x (rope_parameters) spellings; ``params``: one
    attention kind's parameters when config.json gives them per kind (Gemma 3)."""
    if params is None:
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
