"""The portable causal LM: any family's decoder (models/families/, found through models/registry.py) written for
ahead-of-time export.

Module names mirror Hugging Face's (``model.layers.0.self_attn.q_proj.weight``), so checkpoint tensors, the
artifact's ``weights/`` file and AOTInductor constant names are one and the same.

The KV cache is not owned by the model, and no entry point writes it: each layer's K and V ``[B, kv_heads, max_seq,
head_dim]`` (a sliding-window layer's may be a ring of its last positions: ``ring``) are read-only inputs, and the
K/V of the tokens a call runs are returned for the caller to store (one indexed write outside the graph; an in-graph
scatter made AOTInductor copy every active cache row each step). Two entry points:

- ``forward_step``: T tokens per row, row i's at positions ``starts[i]..starts[i]+T-1``, attending to the first L
  cached positions below ``starts[i]`` (a sliding-window layer: those in each token's window) plus, causally, to each
  other. One formula serves prefill (starts 0, prompts right padded to T), decode (T = 1) and speculative
  verification (T = k + 1); it returns the logits of the positions ``logit_index`` picks, the final-normed hidden
  states of every position and the new K/V. Every size (rows, T, L, the number of logits) may be a symbolic size
  when exported with dynamic shapes.
- ``forward_full``: no cache, logits at every position (reference checks).

Example::

    model = load_model(Path("tiny-llama"), torch.float32)    # see neuronpack.models.loading
    logits = model.forward_full(torch.tensor([[1, 2, 3]]))   # [1, 3, vocab] float32
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from neuronpack.models.attention import StepMasks, causal_mask, full_past, window_past
from neuronpack.models.config import FULL, ModelConfig
from neuronpack.models.layers import make_linear, soft_cap
from neuronpack.models.lora import lora_mask
from neuronpack.models.registry import family
from neuronpack.models.rope import PositionTables, rope_cos_sin, rope_inv_freq

# (layer index, x, cos, sin, masks, k cache rows, v cache rows) -> (x, k, v); (hidden, logit_index) -> (logits, normed)
RunLayer = Callable[[int, Tensor, Tensor, Tensor, StepMasks, "Tensor | None", "Tensor | None"],
                    tuple[Tensor, Tensor, Tensor]]
RunHead = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
LOCAL_ROPE = "rope_local_inv_freq"  # the sliding-window layers' inverse frequencies, when their rope differs


class Decoder(nn.Module):
    """``embed_tokens``, ``layers``, ``norm``: the family's modules."""

    def __init__(self, cfg: ModelConfig, int8: frozenset[str]) -> None:
        super().__init__()
        builder = family(cfg.family)
        self.embed_tokens = builder.embedding(cfg)
        self.layers = nn.ModuleList(builder.decoder_layer(cfg, i, int8) for i in range(cfg.num_layers))
        self.norm = builder.norm(cfg, cfg.hidden_size)


class CausalLM(nn.Module):
    """The portable decoder. Build it with ``build_model`` / ``load_model`` rather than directly."""

    def __init__(self, cfg: ModelConfig, int8: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.config = cfg
        self.model = Decoder(cfg, int8)
        self.lm_head = make_linear(cfg.hidden_size, cfg.vocab_size, False, "lm_head" in int8)
        # Non-persistent in HF; here plain buffers so AOTInductor treats them as constants we supply at load.
        for name, rope in rope_buffers(cfg).items():
            self.register_buffer(name, rope_inv_freq(rope, cfg.head_dim), persistent=False)
        self.lora_layout = None  # a LoraLayout once models.lora.attach_lora gave the linears adapter stacks
        self._positions: PositionTables | None = None  # see use_position_tables
        self._causal_masks: dict[tuple[int, int | None], Tensor] = {}

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # -- entry points -------------------------------------------------------------------------------------------
    def forward_step(self, tokens: Tensor, starts: Tensor, n_past: int, k_caches: Sequence[Tensor],
                     v_caches: Sequence[Tensor], logit_index: Tensor, run_layer: RunLayer | None = None,
                     run_head: RunHead | None = None, adapters: Tensor | None = None, ring: int | None = None
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """tokens [B, T] int64 at positions ``starts[i] + 0..T-1`` (starts [B] int64); row i attends to cached
        positions ``0..starts[i]-1`` among the first ``n_past`` of its cache row (k/v caches: per layer
        [B, kv, >= n_past, hd], read only; a sliding-window layer's: with ``ring``, its last ``ring`` positions,
        position p at p % ring) and causally to its own T tokens. logit_index [B, J] int64 picks the
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
        x = self.model.embed_tokens(tokens)  # [B, T, H]
        rotary = {name: tables.rope(name, positions) if tables else self._cos_sin(name, positions, x.dtype)
                  for name in rope_buffers(self.config)}
        kinds = {}  # attention kind -> (cos, sin, masks) of its layers
        for kind in self.config.attention_kinds():
            window = self.config.window(kind)
            past = (full_past(offsets, starts, n_past) if window is None
                    else window_past(offsets, starts, t, n_past, window, ring))
            kinds[kind] = (*rotary[rope_name(self.config, kind)], StepMasks(past, self._causal_mask(t, window)))
        # LoRA: each row's adapter as a mask over the stacked adapter columns [B, 1, W], one more layer argument
        lora = () if adapters is None else (lora_mask(adapters, self.lora_layout, x.dtype),)
        run_layer = run_layer or self.run_layer
        new_k, new_v = [], []
        for i in range(len(self.model.layers)):
            x, k, v = run_layer(i, x, *kinds[self.config.layer_kind(i)], k_caches[i], v_caches[i], *lora)
            new_k.append(k)
            new_v.append(v)
        logits, normed = (run_head or self.run_head)(x, logit_index)
        return logits, normed, torch.stack(new_k), torch.stack(new_v)

    def forward_full(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> float32 logits [B, T, vocab] with causal attention and no cache."""
        b, t = tokens.shape
        positions = torch.arange(t, device=tokens.device).expand(b, t)
        x = self.model.embed_tokens(tokens)
        kinds = {kind: (*self._cos_sin(rope_name(self.config, kind), positions, x.dtype),
                        StepMasks(past=None, new=self._causal_mask(t, self.config.window(kind))))
                 for kind in self.config.attention_kinds()}
        for i in range(len(self.model.layers)):
            x, _, _ = self.run_layer(i, x, *kinds[self.config.layer_kind(i)], None, None)
        return self.logits(self.model.norm(x))

    # -- the two pieces a runtime may replace with compiled graphs ----------------------------------------------
    def run_layer(self, i: int, x: Tensor, cos: Tensor, sin: Tensor, masks: StepMasks, k_rows: Tensor | None,
                  v_rows: Tensor | None, lora: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Decoder layer ``i``: -> (x [B, T, H], the tokens' k and v [B, kv, T, hd]). ``lora``: the per-row adapter
        mask (only passed when the step has adapters)."""
        return self.model.layers[i](x, cos, sin, masks, k_rows, v_rows, lora)

    def run_head(self, hidden: Tensor, logit_index: Tensor) -> tuple[Tensor, Tensor]:
        """hidden [B, T, H], logit_index [B, J] -> (float32 logits [B, J, vocab], final-normed hidden [B, T, H])."""
        return lm_head_at(self.model.norm, self.lm_head, hidden, logit_index, self.config.final_softcap)

    def logits(self, normed: Tensor) -> Tensor:
        """float32 logits of final-normed hidden states [..., H] (soft-capped when the config caps them)."""
        return soft_cap(self.lm_head(normed), self.config.final_softcap).float()

    def use_position_tables(self, length: int) -> None:
        """Make ``forward_step`` look up what it derives from positions below ``length`` (rotary cos/sin rows in the
        embedding's dtype, key positions) instead of computing it each step: the same values (elementwise ops on the
        same inputs), in two ops instead of ~10. A decode step's eager part runs from caches the weights streamed
        through, so each op counts. Positions must then stay below ``length``."""
        offsets = torch.arange(length)
        dtype = self.model.embed_tokens.weight.dtype
        tables = {name: self._cos_sin(name, offsets[None], dtype) for name in rope_buffers(self.config)}
        self._positions = PositionTables(offsets, {n: cs[0][0] for n, cs in tables.items()},
                                         {n: cs[1][0] for n, cs in tables.items()})

    def reset_rope(self) -> None:
        """Give the rope buffers their computed values (a model built on the meta device has none)."""
        for name, rope in rope_buffers(self.config).items():
            setattr(self, name, rope_inv_freq(rope, self.config.head_dim))

    def _cos_sin(self, name: str, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        rope = rope_buffers(self.config)[name]
        return rope_cos_sin(getattr(self, name), positions, dtype, rope.get("attention_scaling", 1.0))

    def _causal_mask(self, t, window: int | None) -> Tensor:
        if not isinstance(t, int):
            return causal_mask(t, self.config.queries_per_kv, window)
        key = (t, window)
        if key not in self._causal_masks:  # a constant per step length (a plain tensor even when made in a step)
            with torch.inference_mode(False):
                self._causal_masks[key] = causal_mask(t, self.config.queries_per_kv, window)
        return self._causal_masks[key]


def rope_buffers(cfg: ModelConfig) -> dict[str, dict]:
    """Buffer name -> rope parameters: ``rope_inv_freq`` (full attention's, every model), and
    ``rope_local_inv_freq`` when sliding-window layers rotate with their own."""
    buffers = {"rope_inv_freq": cfg.rope}
    if cfg.local_rope is not None:
        buffers[LOCAL_ROPE] = cfg.local_rope
    return buffers


def rope_name(cfg: ModelConfig, kind: str) -> str:
    """The rope buffer attention ``kind``'s layers rotate with."""
    return LOCAL_ROPE if kind != FULL and cfg.local_rope is not None else "rope_inv_freq"


def lm_head_at(norm: nn.Module, lm_head: nn.Module, hidden: Tensor, logit_index: Tensor,
               softcap: float | None = None) -> tuple[Tensor, Tensor]:
    """The final norm of every position, the LM head only at ``logit_index`` [B, J] (see ``run_head``)."""
    normed = norm(hidden)
    b, j = logit_index.shape
    picked = normed.gather(1, logit_index[:, :, None].expand(b, j, normed.shape[-1]))
    return soft_cap(lm_head(picked), softcap).float(), normed


def build_model(cfg: ModelConfig, dtype: torch.dtype, int8: frozenset[str] = frozenset(), device="meta"):
    """An uninitialised model on ``device`` (default meta: no memory) in ``dtype``; fill it with
    ``model.load_state_dict(tensors, assign=True)`` (what ``load_model`` does). ``int8`` names the linear
    prefixes held as int8 (``model.layers.0.mlp.up_proj``)."""
    with torch.device(device):
        model = CausalLM(cfg, int8).to(dtype)
    model.reset_rope()  # real values even on meta: computed, not loaded
    return model.eval()
