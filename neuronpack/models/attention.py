"""Grouped-query attention over a read-only KV cache, with the options the families need: q / k norms (Qwen3,
Gemma 3), a sliding window, logit soft-capping, the query scale, and per-head attention sinks (a hook).

Query heads are folded per KV head (``[B, kv, g*T, hd]``: head group, then token) instead of repeating K/V, which
keeps AOTInductor decode as fast as eager. The cache is never written here: a layer reads its cache rows and returns
the keys and values of the tokens it ran (``store_kv`` writes them, outside the graph).

Which cached keys a query may see is ``StepMasks.past``: ``[B, 1, 1, L]`` (the same for every query of a row) for a
full-attention layer, ``[B, 1, T, L]`` (each token its own window) for a sliding-window one, whose cache may hold
every position or only a ring of the last ones (``window_past``). Its own tokens: ``causal_mask`` (windowed too).

Example::

    attn = Attention(cfg, frozenset(), "model.layers.0.self_attn")      # meta or loaded weights
    masks = StepMasks(past=full_past(torch.arange(8), torch.tensor([5]), 8), new=causal_mask(1, cfg.queries_per_kv))
    out, k, v = attn(x, cos, sin, masks, k_rows, v_rows)                  # x [1, 1, H]; k, v [1, kv, 1, hd]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from neuronpack.models.config import ModelConfig
from neuronpack.models.layers import make_linear, soft_cap
from neuronpack.models.lora import project
from neuronpack.models.rope import apply_rope


@dataclass(frozen=True)
class StepMasks:
    """Which keys each query of a step may attend to. ``past``: bool [B, 1, 1 or T, L], cached key positions (or ring
    slots) the row's tokens see; ``new``: bool [1, 1, g*T, T], among the step's own tokens, in the folded query
    order. ``past`` None: no cache (a forward without one)."""

    past: Tensor | None
    new: Tensor


class Attention(nn.Module):
    """q/k/v/o projections (names as HF's), rope, and attention over [cached keys, own keys].

    ``window``: attend to the last ``window`` positions only (the query's own included), with per-token ``past``
    masks; ``qk_norm``: a norm factory (dim -> module) for per-head ``q_norm`` / ``k_norm`` applied before rope."""

    def __init__(self, cfg: ModelConfig, int8: frozenset[str], prefix: str, *, window: int | None = None,
                 qk_norm: Callable[[int], nn.Module] | None = None) -> None:
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.num_kv, self.group, self.head_dim = cfg.num_kv_heads, cfg.queries_per_kv, hd
        self.scale, self.softcap, self.window = cfg.scale, cfg.attn_softcap, window
        self.q_proj = make_linear(h, cfg.num_heads * hd, cfg.qkv_bias, f"{prefix}.q_proj" in int8)
        self.k_proj = make_linear(h, cfg.num_kv_heads * hd, cfg.qkv_bias, f"{prefix}.k_proj" in int8)
        self.v_proj = make_linear(h, cfg.num_kv_heads * hd, cfg.qkv_bias, f"{prefix}.v_proj" in int8)
        self.o_proj = make_linear(cfg.num_heads * hd, h, cfg.o_bias, f"{prefix}.o_proj" in int8)
        self.q_norm = qk_norm(hd) if qk_norm else None
        self.k_norm = qk_norm(hd) if qk_norm else None
        self.kernel = False  # decode steps run torch.ops.neuronpack.decode_attention (models/linear_kernels.py)

    def new_mask(self, t) -> Tensor:
        """The step's own-token mask for T = ``t`` tokens (windowed for a sliding-window layer)."""
        return causal_mask(t, self.group, self.window)

    def sink_logits(self) -> Tensor | None:
        """Per-head attention sinks: float32 [1, kv, g, 1] logits of one extra key every query sees, whose value is
        zero (it only takes probability mass), or None (no sinks). A family with sinks overrides this."""
        return None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, masks: StepMasks, k_past: Tensor | None,
                v_past: Tensor | None, lora: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """x: [B, T, H]; cos/sin: [B, T, hd]; k_past/v_past: cache rows [B, kv, >= L, hd] of which the first L
        (``masks.past.shape[-1]``) are read, or None; lora: [B, 1, W] per-row adapter mask (models/lora.py) or None
        -> (output [B, T, H], the tokens' own k and v [B, kv, T, hd])."""
        b, t, _ = x.shape
        kv, g, hd = self.num_kv, self.group, self.head_dim
        q = project(self.q_proj, x, lora).view(b, t, kv, g, hd)  # query head j*g+i reads KV head j (HF order)
        k = project(self.k_proj, x, lora).view(b, t, kv, hd)
        v = project(self.v_proj, x, lora).view(b, t, kv, hd).transpose(1, 2)  # [B, kv, T, hd]
        if self.q_norm is not None:  # per head, before rope (Qwen3, Gemma 3)
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, cos[:, :, None, None, :], sin[:, :, None, None, :])
        k = apply_rope(k, cos[:, :, None, :], sin[:, :, None, :]).transpose(1, 2)  # [B, kv, T, hd]
        q = q.permute(0, 2, 3, 1, 4).reshape(b, kv, g * t, hd)  # fold: [B, kv, g*T, hd]
        one = isinstance(t, int) and t == 1  # a decode step (static T = 1): products as fused loops, see _scores
        sinks = self.sink_logits()
        if one and self.kernel and k_past is not None and self.softcap is None and sinks is None:
            # the same formula in one C++ pass (kernels/attention.cpp); a window is only a mask there
            n_past = masks.past.shape[-1]
            out = torch.ops.neuronpack.decode_attention(q, k, v, k_past[:, :, :n_past], v_past[:, :, :n_past],
                                                        masks.past, self.scale)
            return project(self.o_proj, out.reshape(b, 1, kv * g * hd), lora), k, v  # [B, kv, g, hd]: HF's head order
        own = self._logits(q, k, one).masked_fill(~masks.new, float("-inf"))  # [B, kv, gT, T] float32
        parts = [own]
        if k_past is not None:  # one softmax over [cached keys, own keys]; the cache is read in place, never copied
            n_past = masks.past.shape[-1]
            k_past, v_past = k_past[:, :, :n_past], v_past[:, :, :n_past]
            past = masks.past if self.window is None else masks.past.repeat(1, 1, g, 1)  # [B, 1, 1 or gT, L]
            parts.insert(0, self._logits(q, k_past, one).masked_fill(~past, float("-inf")))
        if sinks is not None:  # [1, kv, g, 1] -> every token of each head: [B, kv, g*T, 1]
            parts.append(sinks[:, :, :, None, :].expand(b, kv, g, t, 1).reshape(b, kv, g * t, 1))
        probs = torch.softmax(torch.cat(parts, dim=-1), dim=-1).to(v.dtype)
        first = 0 if k_past is None else n_past  # the own keys' columns: after the cached ones, before a sink's
        out = _weighted(probs[..., first:None if sinks is None else first + t], v, one)
        if k_past is not None:
            out = _weighted(probs[..., :n_past], v_past, one) + out
        out = out.view(b, kv, g, t, hd)  # [B, kv, g, T, hd]
        return project(self.o_proj, out.permute(0, 3, 1, 2, 4).reshape(b, t, kv * g * hd), lora), k, v

    def _logits(self, q: Tensor, k: Tensor, one_token: bool) -> Tensor:
        """Scaled (and soft-capped) scores in float32, rounded as transformers' eager attention rounds them: the
        product, the scale and the cap in the compute dtype."""
        return soft_cap(_scores(q, k, one_token) * self.scale, self.softcap).float()


def _scores(q: Tensor, k: Tensor, one_token: bool) -> Tensor:
    """q [B, kv, gT, hd] @ k [B, kv, L, hd].T -> [B, kv, gT, L] in q's dtype. For one token per row (a decode step)
    as a broadcast product summed over hd, which the compiler fuses into one loop over the cache: a matmul call per
    layer costs more than it computes there (bfloat16 ``bmm`` ~30 us on CPU). Float32 accumulation rounded once to
    the dtype, as a bfloat16 matmul does."""
    if one_token:
        return (q.float()[..., :, None, :] * k.float()[..., None, :, :]).sum(-1).to(q.dtype)
    return q @ k.transpose(-1, -2)


def _weighted(p: Tensor, v: Tensor, one_token: bool) -> Tensor:
    """p [B, kv, gT, L] @ v [B, kv, L, hd] -> [B, kv, gT, hd] (see ``_scores``)."""
    if one_token:
        return (p.float()[..., :, :, None] * v.float()[..., None, :, :]).sum(-2).to(v.dtype)
    return p @ v


def causal_mask(t, group: int, window: int | None = None) -> Tensor:
    """bool [1, 1, group*T, T]: folded query row i*T + j (token j) may attend to the step's tokens 0..j (with a
    ``window``: only those after j - window)."""
    token = torch.arange(t).repeat(group)  # [g*T]
    keys = torch.arange(t)[None, :]
    allowed = keys <= token[:, None]
    if window is not None:
        allowed = allowed & (keys > token[:, None] - window)
    return allowed[None, None]


def full_past(offsets: Tensor, starts: Tensor, n_past: int) -> Tensor:
    """bool [B, 1, 1, n_past]: cached positions ``offsets[:n_past]`` (0..n_past-1) below each row's start."""
    return (offsets[:n_past] < starts.view(-1, 1))[:, None, None, :]


def window_past(offsets: Tensor, starts: Tensor, t: int, n_past: int, window: int, ring: int | None) -> Tensor:
    """bool [B, 1, T, L]: for token j of each row (at position start + j), the cached keys within its window (after
    start + j - window, below start). ``ring`` None: the cache holds position p at p, L = n_past; else it holds the
    last ``ring`` positions, p at p % ring, and L = min(n_past, ring) slots are read."""
    starts = starts.view(-1, 1)  # [B, 1]
    if ring is None:
        positions = offsets[:n_past][None, :]  # [1, L]
    else:  # slot r holds the latest position below start that is r modulo the ring (negative: never written)
        slots = offsets[:min(n_past, ring)][None, :]
        positions = starts - 1 - torch.remainder(starts - 1 - slots, ring)  # [B, L]
    lowest = starts + offsets[:t][None, :] - window  # [B, T]: token j sees positions above this
    seen = (positions >= 0) & (positions < starts)  # [B, L]
    return (seen[:, None, :] & (positions[:, None, :] > lowest[:, :, None]))[:, None]


def store_kv(cache: Tensor, rows: Tensor, starts: Tensor, new: Tensor) -> None:
    """Write a step's keys (or values) into a stacked cache, in place: ``new`` [layers, b, kv, T, hd] from
    ``forward_step`` goes to ``cache`` [layers, B, kv, S, hd] rows ``rows`` [b], positions ``starts[i] + 0..T-1``."""
    t = new.shape[3]
    positions = starts.view(-1, 1) + torch.arange(t)  # [b, T]
    # Indices on dims 1 and 3 (split by a slice) index as [b, T, layers, kv, hd].
    cache[:, rows.view(-1, 1), :, positions] = new.permute(1, 3, 0, 2, 4)
