"""Qwen3 (``Qwen3ForCausalLM``): Qwen2's decoder without the q/k/v biases (``attention_bias`` covers all four
projections, as in Llama), an explicit ``head_dim``, and a per-head RMSNorm of the queries and keys (``q_norm``,
``k_norm`` over head_dim) before rope, as transformers' modular_qwen3.py writes it over Llama and Qwen2.

Example::

    cfg = FAMILY.config_from_hf(hf)        # hf: a Qwen3 config.json dict
    FAMILY.attention(cfg, 0, frozenset())  # Attention with q_norm / k_norm
"""

from __future__ import annotations

from neuronpack.models.config import ModelConfig
from neuronpack.models.families.llama import LlamaFamily


class Qwen3Family(LlamaFamily):
    name = "qwen3"

    def attention(self, cfg: ModelConfig, index: int, int8: frozenset[str]):
        from neuronpack.models.attention import Attention

        return Attention(cfg, int8, f"model.layers.{index}.self_attn", window=cfg.window(cfg.layer_kind(index)),
                         qk_norm=lambda dim: self.norm(cfg, dim))


FAMILY = Qwen3Family()
