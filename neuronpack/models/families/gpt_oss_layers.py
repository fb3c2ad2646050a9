"""gpt-oss's layers beside the shared ones (torch; families/gpt_oss.py builds them): its RMSNorm, scaled by the
weight in float32, and attention with per-head sinks.

Example::

    attn = SinkAttention(cfg, frozenset(), "model.layers.0.self_attn", window=128)
    attn.sink_logits().shape      # [1, kv, g, 1]
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from neuronpack.models.attention import Attention
from neuronpack.models.config import ModelConfig
from neuronpack.models.layers import RMSNorm


class FloatScaledRMSNorm(RMSNorm):
    """transformers' GptOssRMSNorm: normalised and scaled by the weight in float32, rounded once to the dtype."""

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32).to(x.dtype)


class SinkAttention(Attention):
    """Attention with ``sinks`` [heads]: each head's logit of a sink every query sees and whose value is zero
    (models/attention.py's ``sink_logits`` hook; transformers' ``s_aux``)."""

    def __init__(self, cfg: ModelConfig, int8: frozenset[str], prefix: str, *, window: int | None) -> None:
        super().__init__(cfg, int8, prefix, window=window)
        self.sinks = nn.Parameter(torch.empty(cfg.num_heads))

    def sink_logits(self) -> Tensor:
        return self.sinks.float().view(1, self.num_kv, self.group, 1)  # query head j * g + i reads KV head j
