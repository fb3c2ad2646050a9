"""Gemma 2 (``Gemma2ForCausalLM``), the base of Gemma 3 (as transformers' modular_gemma3.py is written over Gemma 2):

- sliding-window and global layers alternating (``layer_types``, else every ``sliding_window_pattern``-th layer
  global: every 2nd here), one rope for both;
- RMSNorm with a (1 + w) weight computed in float32, four norms per layer (``SandwichDecoderLayer``);
- GeGLU (gelu tanh), scores scaled by ``query_pre_attn_scalar ** -0.5``, embeddings scaled by sqrt(hidden_size) in
  the model's dtype, attention and final logits soft-capped (``attn_logit_softcapping`` 50, ``final_`` 30 by
  default: the decode attention kernel has no cap, so its layers keep torch ops).

Example::

    cfg = FAMILY.config_from_hf(hf)                    # a gemma2 config.json dict
    cfg.attn_softcap, cfg.final_softcap                # (50.0, 30.0)
"""

from __future__ import annotations

from typing import Any

from neuronpack.errors import UnsupportedModelError
from neuronpack.models.config import (
    FULL,
    SLIDING,
    ModelConfig,
    activation,
    declared_layer_types,
    rope_parameters,
    shapes,
)
from neuronpack.models.families.llama import LlamaFamily


class Gemma2Family(LlamaFamily):
    name = "gemma2"
    pattern = 2  # every 2nd layer global when config.json lists no layer_types
    caps = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}  # config.json's defaults
    attention_cap = "attn_logit_softcapping"  # the key this family's attention reads its cap from

    def config_from_hf(self, hf: dict[str, Any], *, max_seq_len: int | None = None) -> ModelConfig:
        text = self.text_config(hf)
        if text.get("use_bidirectional_attention"):
            raise UnsupportedModelError("bidirectional attention (an embedding model) is not supported",
                                        where="config.json use_bidirectional_attention",
                                        fix=f"use a causal {self.name} checkpoint")
        base = shapes({"head_dim": 256, **text}, text["model_type"], self.name)
        window = int(text.get("sliding_window") or 4096)
        bias = bool(text.get("attention_bias", False))
        rope, local_rope = self.ropes(text)
        return ModelConfig(
            **{**base, "tie_word_embeddings": bool(text.get("tie_word_embeddings", True))},
            qkv_bias=bias,
            o_bias=bias,
            hidden_act=activation(text, "hidden_activation", ("gelu_pytorch_tanh",), "gelu_pytorch_tanh"),
            rope=rope,
            local_rope=local_rope,
            # A window no compiled sequence passes is no window (the sliding layers keep their own rope).
            sliding_window=None if max_seq_len is not None and max_seq_len <= window else window,
            layer_types=self.layer_types(text, base["num_layers"]),
            query_scale=float(text.get("query_pre_attn_scalar", 256)) ** -0.5,
            attn_softcap=_cap(text, self.attention_cap, self.caps),
            final_softcap=_cap(text, "final_logit_softcapping", self.caps),
        )

    def ropes(self, text: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(the full-attention layers' rope, the sliding ones' when it differs)."""
        return rope_parameters(text), None

    def layer_types(self, text: dict[str, Any], layers: int) -> tuple[str, ...]:
        pattern = int(text.get("sliding_window_pattern") or text.get("_sliding_window_pattern") or self.pattern)
        return (declared_layer_types(text, layers)
                or tuple(SLIDING if (i + 1) % pattern else FULL for i in range(layers)))

    def embedding(self, cfg: ModelConfig):
        from neuronpack.models.layers import ScaledEmbedding

        return ScaledEmbedding(cfg.vocab_size, cfg.hidden_size, cfg.hidden_size**0.5)

    def norm(self, cfg: ModelConfig, dim: int):
        from neuronpack.models.layers import OffsetRMSNorm

        return OffsetRMSNorm(dim, cfg.rms_norm_eps)

    def decoder_layer(self, cfg: ModelConfig, index: int, int8: frozenset[str]):
        from neuronpack.models.layers import SandwichDecoderLayer

        return SandwichDecoderLayer(self.attention(cfg, index, int8), self.ffn(cfg, index, int8),
                                    lambda: self.norm(cfg, cfg.hidden_size))


def _cap(text: dict[str, Any], key: str | None, defaults: dict[str, float | None]) -> float | None:
    if key is None:
        return None
    value = text.get(key, defaults.get(key))
    return None if value is None else float(value)


FAMILY = Gemma2Family()
