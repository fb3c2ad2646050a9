"""The Llama family: llama (incl. llama3 rope scaling, SmolLM), mistral (every layer a sliding window), qwen2
(q/k/v projections with bias; sliding-window layers with ``use_sliding_window``). Every other family subclasses
``LlamaFamily`` and overrides what differs.

A family is config.json -> ``ModelConfig`` (``config_from_hf``, torch-free) plus the modules of its decoder
(``embedding``, ``norm``, ``attention``, ``ffn``, ``decoder_layer``: they import torch when called).

Example::

    cfg = FAMILY.config_from_hf(hf)                   # hf: a config.json dict with model_type llama / mistral / qwen2
    layer = FAMILY.decoder_layer(cfg, 0, frozenset())  # pre-norm block: RMSNorm, attention, SwiGLU MLP
"""

from __future__ import annotations

import math
from typing import Any

from neuronpack.models.config import (
    FULL,
    SLIDING,
    ModelConfig,
    activation,
    declared_layer_types,
    rope_parameters,
    shapes,
)


class LlamaFamily:
    """Llama's config reading and modules; the base of every family."""

    name = "llama"

    # -- config.json -> ModelConfig (torch-free) -----------------------------------------------------------------
    def config_from_hf(self, hf: dict[str, Any], *, max_seq_len: int | None = None) -> ModelConfig:
        """``max_seq_len``: the longest sequence compiled (a window it never exceeds is full attention)."""
        model_type = hf["model_type"]
        activation(hf, "hidden_act", ("silu",), "silu")
        attention_bias = bool(hf.get("attention_bias", False))
        qwen = model_type == "qwen2"
        window, layer_types = _sliding_layers(hf, max_seq_len)
        return ModelConfig(
            **shapes(hf, model_type, self.name),
            # qwen2 always has q/k/v bias and no o_proj bias; llama's attention_bias covers all four projections.
            qkv_bias=qwen or attention_bias,
            o_bias=attention_bias and not qwen,
            mlp_bias=bool(hf.get("mlp_bias", False)),
            rope=rope_parameters(hf),
            sliding_window=window,
            layer_types=layer_types,
        )

    def text_config(self, hf: dict[str, Any]) -> dict[str, Any]:
        """The config.json of what is built, as a causal LM's (a multimodal family's text decoder; here ``hf``)."""
        return hf

    # -- checkpoint names (torch-free) ----------------------------------------------------------------------------
    def checkpoint_names(self, names: set[str]) -> dict[str, str]:
        """Our tensor name -> the checkpoint's where they differ ({}: a causal-LM checkpoint's names are ours)."""
        return {}

    def left_out(self, names: set[str]) -> str | None:
        """What of the checkpoint's tensors is not run, said by name (None: everything is)."""
        return None

    # -- modules (torch) ------------------------------------------------------------------------------------------
    def embedding(self, cfg: ModelConfig):
        from neuronpack.models.layers import Embedding

        return Embedding(cfg.vocab_size, cfg.hidden_size)

    def norm(self, cfg: ModelConfig, dim: int):
        from neuronpack.models.layers import RMSNorm

        return RMSNorm(dim, cfg.rms_norm_eps)

    def attention(self, cfg: ModelConfig, index: int, int8: frozenset[str]):
        from neuronpack.models.attention import Attention

        return Attention(cfg, int8, f"model.layers.{index}.self_attn", window=cfg.window(cfg.layer_kind(index)))

    def ffn(self, cfg: ModelConfig, index: int, int8: frozenset[str]):
        from neuronpack.models.layers import GatedMLP

        return GatedMLP(cfg, int8, f"model.layers.{index}.mlp")

    def decoder_layer(self, cfg: ModelConfig, index: int, int8: frozenset[str]):
        from neuronpack.models.layers import DecoderLayer

        return DecoderLayer(self.attention(cfg, index, int8), self.ffn(cfg, index, int8),
                            lambda: self.norm(cfg, cfg.hidden_size))


def _sliding_layers(hf: dict[str, Any], max_seq_len: int | None) -> tuple[int | None, tuple[str, ...]]:
    """(the window, each layer's attention kind), or (None, ()) when no layer's window is ever reached. Mistral:
    every layer; Qwen2 / Qwen3 with ``use_sliding_window``: ``layer_types``, else the layers from
    ``max_window_layers`` on, as transformers builds them."""
    window = hf.get("sliding_window")
    qwen = str(hf.get("model_type")).startswith("qwen")
    # Qwen configs carry a window that only use_sliding_window turns on (off by default).
    if not hf.get("use_sliding_window", not qwen):
        window = None
    if window is None or window >= int(hf.get("max_position_embeddings", math.inf)):
        return None, ()
    if max_seq_len is not None and max_seq_len <= window:
        return None, ()  # never reached: full attention is exact
    layers = int(hf["num_hidden_layers"])
    first = int(hf.get("max_window_layers", layers)) if qwen else 0
    kinds = declared_layer_types(hf, layers) or tuple(SLIDING if i >= first else FULL for i in range(layers))
    return (int(window), kinds) if SLIDING in kinds else (None, ())


FAMILY = LlamaFamily()
