"""The building blocks the families share: norms, linears, embeddings, the gated MLP and the decoder layers that
put a family's attention, norms and FFN together (attention itself: models/attention.py).

Module attribute names are Hugging Face's (``input_layernorm``, ``mlp.gate_proj``...), so checkpoint tensor names,
module names and AOTInductor constant names are one and the same; a family picks which blocks it uses (Gemma 3's
norms are ``OffsetRMSNorm``, its layers ``SandwichDecoderLayer``) and an MoE family passes its own FFN module.

Example::

    layer = DecoderLayer(attention, GatedMLP(cfg, frozenset(), "model.layers.0.mlp"),
                         lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps))
    x, k, v = layer(x, cos, sin, masks, k_rows, v_rows)       # x [B, T, H]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from neuronpack.models.config import ModelConfig
from neuronpack.models.lora import project
from neuronpack.models.quant import Int8Linear

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GeGLU (Gemma)
}


def soft_cap(x: Tensor, cap: float | None) -> Tensor:
    """tanh(x / cap) * cap in x's dtype (Gemma's logit soft-capping), or x when ``cap`` is None."""
    return x if cap is None else torch.tanh(x / cap) * cap


class RMSNorm(nn.Module):
    """Llama's RMSNorm: normalise in float32, cast back, then scale by ``weight`` (in its dtype)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # Same arithmetic as transformers: normalise in float32, cast back, then scale.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class OffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the weight is stored as an offset from 1, and the whole norm runs in float32, cast once at
    the end (``x * rsqrt(mean(x^2) + eps) * (1 + w)``, as transformers' Gemma3RMSNorm)."""

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class Linear(nn.Module):
    """nn.Linear without random init: weights always come from a checkpoint, and initialising on the meta device
    would pull in torch's Python reference kernels (seconds of imports at load time). ``kernel``: run neuronpack's
    decode kernel (``torch.ops.neuronpack.linear``, models/linear_kernels.py) instead of ``F.linear``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.kernel = False

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel:
            return torch.ops.neuronpack.linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    """nn.Embedding without random init (see Linear)."""

    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim))

    def forward(self, tokens: Tensor) -> Tensor:
        return F.embedding(tokens, self.weight)


class ScaledEmbedding(Embedding):
    """An embedding multiplied by ``scale`` rounded to the weight's dtype (Gemma: sqrt(hidden_size), as
    transformers' Gemma3TextScaledWordEmbedding rounds it)."""

    def __init__(self, num_embeddings: int, dim: int, scale: float) -> None:
        super().__init__(num_embeddings, dim)
        self.scale = scale

    def forward(self, tokens: Tensor) -> Tensor:
        scale = torch.tensor(self.scale, dtype=torch.float32).to(self.weight.dtype)
        return F.embedding(tokens, self.weight) * scale


def make_linear(in_features: int, out_features: int, bias: bool, int8: bool) -> nn.Module:
    """A float ``Linear``, or an ``Int8Linear`` when the checkpoint holds this linear as int8."""
    if int8:
        return Int8Linear(in_features, out_features, bias=bias)
    return Linear(in_features, out_features, bias=bias)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU (silu) or GeGLU (gelu tanh), ``cfg.hidden_act``."""

    def __init__(self, cfg: ModelConfig, int8: frozenset[str], prefix: str) -> None:
        super().__init__()
        h, i, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = make_linear(h, i, bias, f"{prefix}.gate_proj" in int8)
        self.up_proj = make_linear(h, i, bias, f"{prefix}.up_proj" in int8)
        self.down_proj = make_linear(i, h, bias, f"{prefix}.down_proj" in int8)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: Tensor, lora: Tensor | None = None) -> Tensor:
        gate, up = project(self.gate_proj, x, lora), project(self.up_proj, x, lora)
        return project(self.down_proj, self.act(gate) * up, lora)


class DecoderLayer(nn.Module):
    """A pre-norm block (Llama): x += attn(input_layernorm(x)); x += ffn(post_attention_layernorm(x)).

    ``attention``: the layer's attention (models/attention.py), ``ffn``: its feed-forward module, called
    ``ffn(x, lora)`` (``GatedMLP``, or an MoE family's), held as ``ffn_name`` (HF's name: ``mlp``); ``norm``: makes
    each of the layer's norms."""

    def __init__(self, attention: nn.Module, ffn: nn.Module, norm: Callable[[], nn.Module], ffn_name: str = "mlp"):
        super().__init__()
        self.self_attn = attention
        self.ffn_name = ffn_name
        setattr(self, ffn_name, ffn)
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()

    def feed_forward(self, x: Tensor, lora: Tensor | None) -> Tensor:
        return getattr(self, self.ffn_name)(x, lora)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, masks, k_past: Tensor | None,
                v_past: Tensor | None, lora: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, T, H] -> (x, the tokens' k and v [B, kv, T, hd]); see Attention.forward for the rest."""
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, masks, k_past, v_past, lora)
        x = x + attn
        return x + self.feed_forward(self.post_attention_layernorm(x), lora), k, v


class SandwichDecoderLayer(DecoderLayer):
    """Four norms per layer (Gemma 2 / 3): x += post_attention_layernorm(attn(input_layernorm(x)));
    x += post_feedforward_layernorm(ffn(pre_feedforward_layernorm(x)))."""

    def __init__(self, attention: nn.Module, ffn: nn.Module, norm: Callable[[], nn.Module], ffn_name: str = "mlp"):
        super().__init__(attention, ffn, norm, ffn_name)
        self.pre_feedforward_layernorm = norm()
        self.post_feedforward_layernorm = norm()

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, masks, k_past: Tensor | None,
                v_past: Tensor | None, lora: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, masks, k_past, v_past, lora)
        x = x + self.post_attention_layernorm(attn)
        ffn = self.feed_forward(self.pre_feedforward_layernorm(x), lora)
        return x + self.post_feedforward_layernorm(ffn), k, v
