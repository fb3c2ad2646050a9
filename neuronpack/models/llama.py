"""A compact Llama-family decoder (llama, llama3, mistral, qwen2, SmolLM) written for ahead-of-time export.

Module names mirror Hugging Face's (``model.layers.0.self_attn.q_proj.weight``), so checkpoint tensors, the
artifact's ``weights/`` file and AOTInductor constant names are one and the same.

The KV cache is not owned by the model: each layer has one K and one V tensor ``[B, kv_heads, max_seq, head_dim]``
passed in and written in place. Query heads are folded per KV head (``[B, kv, g*T, hd]``) instead of repeating K/V,
which keeps AOTInductor decode as fast as eager. Three entry points:

- ``forward_context``: N prompts right padded to T tokens, written to cache rows ``slots`` at positions 0..T-1,
  logits of position ``last_index`` returned (padding beyond a prompt is harmless: decode masks by position).
  With ``return_hidden`` it also returns the final-normed hidden states of all T positions, so a runtime can apply
  the LM head to every prompt position when asked (prompt logprobs) without a second pass.
- ``forward_decode``: one token per cache row at ``positions``; attends to the slice ``[:attend_len]`` of the cache.
  Every size (N, T, the number of rows, attend_len) may be a symbolic size when exported with dynamic shapes.
- ``forward_full``: no cache, logits at every position (reference checks).

Example::

    model = load_model(Path("tiny-llama"), torch.float32)    # see neuronpack.models.loading
    logits = model.forward_full(torch.tensor([[1, 2, 3]]))   # [1, 3, vocab] float32
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from neuronpack.models.config import ModelConfig
from neuronpack.models.quant import Int8Linear

# (k, v, k_cache, v_cache) -> (keys, values) that the layer attends to; each mode writes the cache its own way.
CacheWrite = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


class RMSNorm(nn.Module):
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


class Linear(nn.Module):
    """nn.Linear without random init: weights always come from a checkpoint, and initialising on the meta device
    would pull in torch's Python reference kernels (seconds of imports at load time)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    """nn.Embedding without random init (see Linear)."""

    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim))

    def forward(self, tokens: Tensor) -> Tensor:
        return F.embedding(tokens, self.weight)


def make_linear(in_features: int, out_features: int, bias: bool, int8: bool) -> nn.Module:
    if int8:
        return Int8Linear(in_features, out_features, bias=bias)
    return Linear(in_features, out_features, bias=bias)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, int8: frozenset[str], prefix: str) -> None:
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.num_kv, self.group, self.head_dim = cfg.num_kv_heads, cfg.queries_per_kv, hd
        self.q_proj = make_linear(h, cfg.num_heads * hd, cfg.qkv_bias, f"{prefix}.q_proj" in int8)
        self.k_proj = make_linear(h, cfg.num_kv_heads * hd, cfg.qkv_bias, f"{prefix}.k_proj" in int8)
        self.v_proj = make_linear(h, cfg.num_kv_heads * hd, cfg.qkv_bias, f"{prefix}.v_proj" in int8)
        self.o_proj = make_linear(cfg.num_heads * hd, h, cfg.o_bias, f"{prefix}.o_proj" in int8)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, k_cache: Tensor, v_cache: Tensor, write: CacheWrite
    ) -> Tensor:
        # x: [B, T, H]; cos/sin: [B, T, hd]; mask: [B, 1, g*T, L] bool in the folded row order (True = may attend)
        b, t, _ = x.shape
        kv, g, hd = self.num_kv, self.group, self.head_dim
        q = self.q_proj(x).view(b, t, kv, g, hd)  # query head j*g+i reads KV head j (HF repeat_kv order)
        k = self.k_proj(x).view(b, t, kv, hd)
        v = self.v_proj(x).view(b, t, kv, hd).transpose(1, 2)  # [B, kv, T, hd]
        q = apply_rope(q, cos[:, :, None, None, :], sin[:, :, None, None, :])
        k = apply_rope(k, cos[:, :, None, :], sin[:, :, None, :]).transpose(1, 2)  # [B, kv, T, hd]
        keys, values = write(k, v, k_cache, v_cache)  # [B, kv, L, hd]
        q = q.permute(0, 2, 3, 1, 4).reshape(b, kv, g * t, hd)  # fold: [B, kv, g*T, hd]
        scores = (q @ keys.transpose(-1, -2)) * (1.0 / math.sqrt(hd))  # [B, kv, g*T, L]
        scores = scores.float().masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
        out = (probs @ values).view(b, kv, g, t, hd)  # [B, kv, g, T, hd]
        return self.o_proj(out.permute(0, 3, 1, 2, 4).reshape(b, t, kv * g * hd))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, int8: frozenset[str], prefix: str) -> None:
        super().__init__()
        h, i, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = make_linear(h, i, bias, f"{prefix}.gate_proj" in int8)
        self.up_proj = make_linear(h, i, bias, f"{prefix}.up_proj" in int8)
        self.down_proj = make_linear(i, h, bias, f"{prefix}.down_proj" in int8)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, int8: frozenset[str], index: int) -> None:
        super().__init__()
        prefix = f"model.layers.{index}"
        self.self_attn = Attention(cfg, int8, f"{prefix}.self_attn")
        self.mlp = MLP(cfg, int8, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, kc: Tensor, vc: Tensor, write: CacheWrite):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, kc, vc, write)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig, int8: frozenset[str]) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, int8, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The portable decoder. Build it with ``build_model`` / ``load_model`` rather than directly."""

    def __init__(self, cfg: ModelConfig, int8: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.config = cfg
        self.model = Decoder(cfg, int8)
        self.lm_head = make_linear(cfg.hidden_size, cfg.vocab_size, False, "lm_head" in int8)
        # Non-persistent in HF; here a plain buffer so AOTInductor treats it as a constant we supply at load.
        self.register_buffer("rope_inv_freq", rope_inv_freq(cfg), persistent=False)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # -- entry points -------------------------------------------------------------------------------------------
    def forward_context(
        self, tokens: Tensor, last_index: Tensor, slots: Tensor, k_caches: Sequence[Tensor], v_caches: Sequence[Tensor],
        return_hidden: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """tokens [N, T] int64 (N prompts, right padded to T), last_index [N] int64, slots [N] int64 (cache rows)
        -> float32 logits [N, vocab] of each prompt's token at ``last_index``; with ``return_hidden`` also the
        final-normed hidden states [N, T, hidden] (compute dtype) of every position."""
        n, t = tokens.shape
        positions = torch.arange(t, device=tokens.device).unsqueeze(0).expand(n, t)  # [N, T]
        mask = self._fold_mask(positions, t)  # causal

        def write(k: Tensor, v: Tensor, kc: Tensor, vc: Tensor) -> tuple[Tensor, Tensor]:
            kc[:, :, :t].index_copy_(0, slots, k)  # each prompt's KV into its row, positions 0..T-1
            vc[:, :, :t].index_copy_(0, slots, v)
            return k, v

        hidden = self._decode_layers(tokens, positions, mask, k_caches, v_caches, write)  # [N, T, H]
        if return_hidden:  # norm every row (cheap), LM head on the last only: the caller heads the rest on demand
            normed = self.model.norm(hidden)
            last = normed.gather(1, last_index.view(n, 1, 1).expand(n, 1, normed.shape[-1]))
            return self.lm_head(last).float()[:, 0], normed
        last = hidden.gather(1, last_index.view(n, 1, 1).expand(n, 1, hidden.shape[-1]))  # [N, 1, H]
        return self._logits(last)[:, 0]

    def forward_decode(
        self, tokens: Tensor, positions: Tensor, k_caches: Sequence[Tensor], v_caches: Sequence[Tensor], attend_len: int
    ) -> Tensor:
        """tokens [B] int64 at positions [B] int64 -> float32 logits [B, vocab]; attends to cache[:, :, :attend_len]."""
        b = tokens.shape[0]
        pos = positions.view(b, 1)
        mask = self._fold_mask(pos, attend_len)

        def write(k: Tensor, v: Tensor, kc: Tensor, vc: Tensor) -> tuple[Tensor, Tensor]:
            # k, v: [B, kv, 1, hd] scattered at each row's own position along the sequence axis.
            index = pos.view(b, 1, 1, 1).expand(b, k.shape[1], 1, k.shape[3])
            kc.scatter_(2, index, k)
            vc.scatter_(2, index, v)
            return kc[:, :, :attend_len], vc[:, :, :attend_len]

        hidden = self._decode_layers(tokens.view(b, 1), pos, mask, k_caches, v_caches, write)  # [B, 1, H]
        return self._logits(hidden)[:, 0]

    def forward_full(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> float32 logits [B, T, vocab] with causal attention and no cache."""
        b, t = tokens.shape
        positions = torch.arange(t, device=tokens.device).expand(b, t)
        mask = self._fold_mask(positions, t)
        empty = [torch.empty(0)] * self.config.num_layers
        hidden = self._decode_layers(tokens, positions, mask, empty, empty, lambda k, v, kc, vc: (k, v))
        return self._logits(hidden)

    # -- shared body --------------------------------------------------------------------------------------------
    def _fold_mask(self, positions: Tensor, n_keys) -> Tensor:
        """positions [B, T] of the queries -> bool [B, 1, g*T, n_keys], True where key position <= query position,
        rows in the folded order (query head group, then token). Built from positions alone (no views of
        symbolic shapes), so one formula serves context, decode and full forwards under dynamic shapes."""
        query = positions.repeat(1, self.config.queries_per_kv)  # [B, g*T]: row i*T + j is token j
        keys = torch.arange(n_keys, device=positions.device)
        return (keys[None, None, :] <= query[:, :, None])[:, None]

    def _decode_layers(self, tokens, positions, mask, k_caches, v_caches, write: CacheWrite) -> Tensor:
        x = self.model.embed_tokens(tokens)  # [B, T, H]
        cos, sin = rope_cos_sin(self.rope_inv_freq, positions, x.dtype)  # [B, T, hd]
        for layer, kc, vc in zip(self.model.layers, k_caches, v_caches, strict=True):
            x = layer(x, cos, sin, mask, kc, vc, write)
        return x

    def _logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(self.model.norm(hidden)).float()


def build_model(cfg: ModelConfig, dtype: torch.dtype, int8: frozenset[str] = frozenset(), device="meta"):
    """An uninitialised model on ``device`` (default meta: no memory) in ``dtype``; fill it with
    ``model.load_state_dict(tensors, assign=True)`` (what ``load_model`` does). ``int8`` names the linear
    prefixes held as int8 (``model.layers.0.mlp.up_proj``)."""
    with torch.device(device):
        model = LlamaForCausalLM(cfg, int8).to(dtype)
    model.rope_inv_freq = rope_inv_freq(cfg)  # real values even on meta: computed, not loaded
    return model.eval()


def rope_inv_freq(cfg: ModelConfig) -> Tensor:
    """[head_dim / 2] float32 inverse frequencies, computed exactly as transformers does (incl. llama3 scaling)."""
    rope, dim = cfg.rope, cfg.head_dim
    with torch.device("cpu"):
        inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope["rope_type"] == "linear":
        inv_freq = inv_freq / rope["factor"]
    elif rope["rope_type"] == "llama3":
        inv_freq = _llama3_scale(inv_freq, rope)
    return inv_freq


def _llama3_scale(inv_freq: Tensor, rope: dict) -> Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated (Llama 3.1).
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(inv_freq: Tensor, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [B, T] -> cos, sin [B, T, head_dim] in ``dtype`` (rotate-half layout, like transformers)."""
    freqs = positions[..., None].float() * inv_freq.float()  # [B, T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
