"""A compact Llama-family decoder (llama, llama3, mistral, qwen2, SmolLM) written for ahead-of-time export.

Module names mirror Hugging Face's (``model.layers.0.self_attn.q_proj.weight``), so checkpoint tensors, the
artifact's ``weights/`` file and AOTInductor constant names are one and the same.

The KV cache is not owned by the model, and no entry point writes it: each layer's K and V ``[B, kv_heads, max_seq,
head_dim]`` are read-only inputs, and the K/V of the tokens a call runs are returned for the caller to store (one
indexed write outside the graph; an in-graph scatter made AOTInductor copy every active cache row each step).
Query heads are folded per KV head (``[B, kv, g*T, hd]``) instead of repeating K/V, which keeps AOTInductor decode
as fast as eager. Two entry points:

- ``forward_step``: T tokens per row, row i's at positions ``starts[i]..starts[i]+T-1``, attending to the first L
  cached positions below ``starts[i]`` plus, causally, to each other. One formula serves prefill (starts 0, prompts
  right padded to T), decode (T = 1) and speculative verification (T = k + 1); it returns the logits of the positions
  ``logit_index`` picks, the final-normed hidden states of every position and the new K/V.
  Every size (rows, T, L, the number of logits) may be a symbolic size when exported with dynamic shapes.
- ``forward_full``: no cache, logits at every position (reference checks).

Example::

    model = load_model(Path("tiny-llama"), torch.float32)    # see neuronpack.models.loading
    logits = model.forward_full(torch.tensor([[1, 2, 3]]))   # [1, 3, vocab] float32
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from neuronpack.models.config import ModelConfig
from neuronpack.models.lora import lora_mask, project
from neuronpack.models.quant import Int8Linear


@dataclass(frozen=True)
class StepMasks:
    """Which keys each query of a step may attend to, in the folded query order (head group, then token).

    ``past``: bool [B, 1, 1, L], cached key positions below the row's start; ``new``: bool [1, 1, g*T, T], causal
    among the step's own tokens. ``past`` None: no cache (a forward without one)."""

    past: Tensor | None
    new: Tensor


# (layer index, x, cos, sin, masks, k cache rows, v cache rows) -> (x, k, v); (hidden, logit_index) -> (logits, normed)
RunLayer = Callable[[int, Tensor, Tensor, Tensor, StepMasks, "Tensor | None", "Tensor | None"],
                    tuple[Tensor, Tensor, Tensor]]
RunHead = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


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
        self.kernel = False  # decode steps run torch.ops.neuronpack.decode_attention (models/linear_kernels.py)

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
        q = apply_rope(q, cos[:, :, None, None, :], sin[:, :, None, None, :])
        k = apply_rope(k, cos[:, :, None, :], sin[:, :, None, :]).transpose(1, 2)  # [B, kv, T, hd]
        q = q.permute(0, 2, 3, 1, 4).reshape(b, kv, g * t, hd)  # fold: [B, kv, g*T, hd]
        scale = 1.0 / math.sqrt(hd)
        one = isinstance(t, int) and t == 1  # a decode step (static T = 1): products as fused loops, see _scores
        if one and self.kernel and k_past is not None:  # the same formula in one C++ pass (kernels/attention.cpp)
            n_past = masks.past.shape[-1]
            out = torch.ops.neuronpack.decode_attention(q, k, v, k_past[:, :, :n_past], v_past[:, :, :n_past],
                                                        masks.past, scale)
            return project(self.o_proj, out.reshape(b, 1, kv * g * hd), lora), k, v  # [B, kv, g, hd]: HF's head order
        scores = (_scores(q, k, one) * scale).float().masked_fill(~masks.new, float("-inf"))  # [B,kv,gT,T]
        if k_past is None:
            out = _weighted(torch.softmax(scores, dim=-1).to(v.dtype), v, one)
        else:  # one softmax over [cached keys, own keys]; the cache is read in place, never concatenated
            n_past = masks.past.shape[-1]
            k_past, v_past = k_past[:, :, :n_past], v_past[:, :, :n_past]
            past = (_scores(q, k_past, one) * scale).float().masked_fill(~masks.past, float("-inf"))
            probs = torch.softmax(torch.cat((past, scores), dim=-1), dim=-1).to(v.dtype)
            out = _weighted(probs[..., :n_past], v_past, one) + _weighted(probs[..., n_past:], v, one)
        out = out.view(b, kv, g, t, hd)  # [B, kv, g, T, hd]
        return project(self.o_proj, out.permute(0, 3, 1, 2, 4).reshape(b, t, kv * g * hd), lora), k, v


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


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, int8: frozenset[str], prefix: str) -> None:
        super().__init__()
        h, i, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = make_linear(h, i, bias, f"{prefix}.gate_proj" in int8)
        self.up_proj = make_linear(h, i, bias, f"{prefix}.up_proj" in int8)
        self.down_proj = make_linear(i, h, bias, f"{prefix}.down_proj" in int8)

    def forward(self, x: Tensor, lora: Tensor | None = None) -> Tensor:
        gate, up = project(self.gate_proj, x, lora), project(self.up_proj, x, lora)
        return project(self.down_proj, F.silu(gate) * up, lora)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, int8: frozenset[str], index: int) -> None:
        super().__init__()
        prefix = f"model.layers.{index}"
        self.self_attn = Attention(cfg, int8, f"{prefix}.self_attn")
        self.mlp = MLP(cfg, int8, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, masks: StepMasks, k_past: Tensor | None,
                v_past: Tensor | None, lora: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, masks, k_past, v_past, lora)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x), lora), k, v


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
        self.lora_layout = None  # a LoraLayout once models.lora.attach_lora gave the linears adapter stacks
        self._positions: PositionTables | None = None  # see use_position_tables
        self._causal_masks: dict[int, Tensor] = {}

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # -- entry points -------------------------------------------------------------------------------------------
    def forward_step(self, tokens: Tensor, starts: Tensor, n_past: int, k_caches: Sequence[Tensor],
                     v_caches: Sequence[Tensor], logit_index: Tensor, run_layer: RunLayer | None = None,
                     run_head: RunHead | None = None, adapters: Tensor | None = None
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """tokens [B, T] int64 at positions ``starts[i] + 0..T-1`` (starts [B] int64); row i attends to cached
        positions ``0..starts[i]-1`` among the first ``n_past`` of its cache row (k/v caches: per layer
        [B, kv, >= n_past, hd], read only) and causally to its own T tokens. logit_index [B, J] int64 picks the
        positions (0..T-1) whose logits are returned. adapters [B] int64: each row's LoRA adapter slot (0: none;
        only for a model given adapters by ``models.lora.attach_lora``).

        Returns (logits [B, J, vocab] float32, final-normed hidden states [B, T, hidden] in the compute dtype,
        keys and values of the T tokens [layers, B, kv, T, hd]: the caller stores them at their positions).

        ``run_layer(i, x, cos, sin, masks, k_rows, v_rows)`` and ``run_head(hidden, logit_index)`` replace the
        decoder layers and the final norm + LM head (a runtime passes its compiled graphs); by default this model's
        own modules run."""
        b, t = tokens.shape
        tables = self._positions
        offsets = tables.offsets if tables else torch.arange(max(t, n_past), device=tokens.device)
        positions = starts.view(b, 1) + offsets[:t]  # [B, T]
        masks = StepMasks(past=(offsets[:n_past] < starts.view(b, 1))[:, None, None, :], new=self._causal_mask(t))
        x = self.model.embed_tokens(tokens)  # [B, T, H]
        cos, sin = tables.rope(positions) if tables else rope_cos_sin(self.rope_inv_freq, positions, x.dtype)
        # LoRA: each row's adapter as a mask over the stacked adapter columns [B, 1, W], one more layer argument
        lora = () if adapters is None else (lora_mask(adapters, self.lora_layout, x.dtype),)
        run_layer = run_layer or self.run_layer
        new_k, new_v = [], []
        for i in range(len(self.model.layers)):
            x, k, v = run_layer(i, x, cos, sin, masks, k_caches[i], v_caches[i], *lora)
            new_k.append(k)
            new_v.append(v)
        logits, normed = (run_head or self.run_head)(x, logit_index)
        return logits, normed, torch.stack(new_k), torch.stack(new_v)

    def forward_full(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> float32 logits [B, T, vocab] with causal attention and no cache."""
        b, t = tokens.shape
        positions = torch.arange(t, device=tokens.device).expand(b, t)
        masks = StepMasks(past=None, new=self._causal_mask(t))
        x = self.model.embed_tokens(tokens)
        cos, sin = rope_cos_sin(self.rope_inv_freq, positions, x.dtype)
        for i in range(len(self.model.layers)):
            x, _, _ = self.run_layer(i, x, cos, sin, masks, None, None)
        return self.lm_head(self.model.norm(x)).float()

    # -- the two pieces a runtime may replace with compiled graphs ----------------------------------------------
    def run_layer(self, i: int, x: Tensor, cos: Tensor, sin: Tensor, masks: StepMasks, k_rows: Tensor | None,
                  v_rows: Tensor | None, lora: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Decoder layer ``i``: -> (x [B, T, H], the tokens' k and v [B, kv, T, hd]). ``lora``: the per-row adapter
        mask (only passed when the step has adapters)."""
        return self.model.layers[i](x, cos, sin, masks, k_rows, v_rows, lora)

    def run_head(self, hidden: Tensor, logit_index: Tensor) -> tuple[Tensor, Tensor]:
        """hidden [B, T, H], logit_index [B, J] -> (float32 logits [B, J, vocab], final-normed hidden [B, T, H])."""
        return lm_head_at(self.model.norm, self.lm_head, hidden, logit_index)

    def use_position_tables(self, length: int) -> None:
        """Make ``forward_step`` look up what it derives from positions below ``length`` (rotary cos/sin rows in the
        embedding's dtype, key positions) instead of computing it each step: the same values (elementwise ops on the
        same inputs), in two ops instead of ~10. A decode step's eager part runs from caches the weights streamed
        through, so each op counts. Positions must then stay below ``length``."""
        offsets = torch.arange(length)
        cos, sin = rope_cos_sin(self.rope_inv_freq, offsets[None], self.model.embed_tokens.weight.dtype)
        self._positions = PositionTables(offsets, cos[0], sin[0])

    def _causal_mask(self, t) -> Tensor:
        if not isinstance(t, int):
            return causal_mask(t, self.config.queries_per_kv)
        if t not in self._causal_masks:  # a constant per step length (a plain tensor even when made in a step)
            with torch.inference_mode(False):
                self._causal_masks[t] = causal_mask(t, self.config.queries_per_kv)
        return self._causal_masks[t]


@dataclass(frozen=True)
class PositionTables:
    """``offsets`` [P] int64 (0..P-1); rotary ``cos`` / ``sin`` [P, head_dim] of those positions."""

    offsets: Tensor
    cos: Tensor
    sin: Tensor

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions [B, T] (< P) -> cos, sin [B, T, head_dim], as ``rope_cos_sin`` computes them."""
        return F.embedding(positions, self.cos), F.embedding(positions, self.sin)


def causal_mask(t, group: int) -> Tensor:
    """bool [1, 1, group*T, T]: folded query row i*T + j (token j) may attend to the step's tokens 0..j."""
    token = torch.arange(t).repeat(group)  # [g*T]
    return (torch.arange(t)[None, :] <= token[:, None])[None, None]


def lm_head_at(norm: nn.Module, lm_head: nn.Module, hidden: Tensor, logit_index: Tensor) -> tuple[Tensor, Tensor]:
    """The final norm of every position, the LM head only at ``logit_index`` [B, J] (see ``run_head``)."""
    normed = norm(hidden)
    b, j = logit_index.shape
    picked = normed.gather(1, logit_index[:, :, None].expand(b, j, normed.shape[-1]))
    return lm_head(picked).float(), normed


def store_kv(cache: Tensor, rows: Tensor, starts: Tensor, new: Tensor) -> None:
    """Write a step's keys (or values) into a stacked cache, in place: ``new`` [layers, b, kv, T, hd] from
    ``forward_step`` goes to ``cache`` [layers, B, kv, S, hd] rows ``rows`` [b], positions ``starts[i] + 0..T-1``."""
    t = new.shape[3]
    positions = starts.view(-1, 1) + torch.arange(t)  # [b, T]
    # Indices on dims 1 and 3 (split by a slice) index as [b, T, layers, kv, hd].
    cache[:, rows.view(-1, 1), :, positions] = new.permute(1, 3, 0, 2, 4)


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
