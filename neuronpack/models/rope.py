"""Rotary position embeddings, computed exactly as transformers computes them: the inverse frequencies of a rope
(``default``, ``linear``, ``llama3``), the cos / sin rows of positions, and the rotation (rotate-half layout).

A model may rotate different layers with different ropes (Gemma 3: its sliding-window layers with
``rope_local_base_freq``, its global layers with ``rope_theta`` and ``rope_scaling``): ``ModelConfig.rope_for(kind)``
names each attention kind's parameters, and the model keeps one table per distinct rope (``PositionTables``).

Example::

    inv_freq = rope_inv_freq({"rope_type": "default", "rope_theta": 10000.0}, head_dim=64)    # [32] float32
    cos, sin = rope_cos_sin(inv_freq, torch.arange(8)[None], torch.float32)                 # [1, 8, 64] each
    q = apply_rope(q, cos[:, :, None, :], sin[:, :, None, :])                               # q [B, T, heads, 64]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def rope_inv_freq(rope: Mapping[str, Any], head_dim: int) -> Tensor:
    """[head_dim / 2] float32 inverse frequencies of ``rope`` (``ModelConfig.rope``: rope_type, rope_theta and the
    type's parameters), computed exactly as transformers does (llama3: Llama 3.1's band-wise scaling)."""
    with torch.device("cpu"):
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv_freq = 1.0 / (rope["rope_theta"] ** exponents)
    return SCALINGS[rope["rope_type"]](inv_freq, rope)


def _linear_scale(inv_freq: Tensor, rope: Mapping[str, Any]) -> Tensor:
    return inv_freq / rope["factor"]


def _llama3_scale(inv_freq: Tensor, rope: Mapping[str, Any]) -> Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated (Llama 3.1).
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


# rope_type -> the inverse frequencies from the default ones (transformers' ROPE_INIT_FUNCTIONS); a rope whose cos / sin
# are also scaled (YaRN) records that factor as the parameters' "attention_scaling" (see rope_cos_sin)
SCALINGS = {"default": lambda inv_freq, rope: inv_freq, "linear": _linear_scale, "llama3": _llama3_scale}


def rope_cos_sin(inv_freq: Tensor, positions: Tensor, dtype: torch.dtype, scaling: float = 1.0
                 ) -> tuple[Tensor, Tensor]:
    """positions [B, T] -> cos, sin [B, T, head_dim] in ``dtype`` (rotate-half layout, like transformers).
    ``scaling``: transformers' ``attention_scaling`` of the rope (1 but for YaRN-like ropes), applied in float32."""
    freqs = positions[..., None].float() * inv_freq.float()  # [B, T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    if scaling == 1.0:
        return emb.cos().to(dtype), emb.sin().to(dtype)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [..., hd] rotated by cos / sin broadcastable to it (rotate-half: pairs i and i + hd/2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@dataclass(frozen=True)
class PositionTables:
    """``offsets`` [P] int64 (0..P-1); per rope (by its name in the model, e.g. ``rope_inv_freq``) the rotary
    ``cos`` / ``sin`` rows [P, head_dim] of those positions."""

    offsets: Tensor
    cos: Mapping[str, Tensor]
    sin: Mapping[str, Tensor]

    def rope(self, name: str, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions [B, T] (< P) -> cos, sin [B, T, head_dim], as ``rope_cos_sin`` computes them."""
        return F.embedding(positions, self.cos[name]), F.embedding(positions, self.sin[name])
