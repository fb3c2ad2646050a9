"""EAGLE draft models (eager PyTorch, or compiled by the portable backend), loaded as ``neuronpack convert-eagle``
writes them: EAGLE-1/2 (Li et al. 2024, SafeAILab/EAGLE ``cnets1.py``) and EAGLE-3 (Li et al. 2025, vLLM's
``llama_eagle3.py``).

Both draft at the feature level. Draft position j reads the pair (token x_{j+1}, a hidden state for position j) and
predicts x_{j+2}. The hidden state of a verified position comes from the target (``from_target``); a draft's own
further positions feed its own output back:

- EAGLE-1/2: the target's final-normed hidden state h_j (``target_layers`` None). Per position
  ``z = fc(cat(embed(x_{j+1}), h_j))`` (fc: Linear(2H -> H), bias when the draft has one), then the decoder
  layer(s) (layer 0 without input_layernorm unless the draft ships one); ``logits = lm_head(z)`` (the target's head,
  added by convert-eagle; no final norm). The output z is the next position's h.
- EAGLE-3: the target's residual stream entering three of its layers (``target_layers``: the draft config's
  ``eagle_aux_hidden_state_layer_ids``, else vLLM's default (2, L // 2, L - 3)), concatenated [3H] and projected by
  ``fc`` (3H -> H, once, in ``from_target``). Layer 0 reads ``cat(input_layernorm(embed(x_{j+1})),
  hidden_norm(h))`` [2H] (its q/k/v take 2H inputs) with h as the residual (``norm_before_residual``: the normed h);
  further layers are plain; ``logits = lm_head(norm(z))`` with the draft's own head and norm, and the un-normed z is
  the next position's h. convert-eagle keeps only drafts whose vocabulary is the target's, so d2t is the identity.

The draft keeps its own KV cache (one position per pair, RoPE at the pair's position j); the layer, norm, RoPE and
attention code are the shared layers' (models/layers.py, attention.py, rope.py: one implementation).
``forward_step`` builds positions, masks and rotary tables eagerly and runs ``forward`` (``run_core``: a compiled
graph of it, weights as inputs) then ``head``.

Converted-draft tensors: ``embed_tokens.weight``, ``fc.weight`` (+ ``fc.bias``), ``layers.N.*`` (EAGLE-3: with
``layers.0.hidden_norm.weight``), ``lm_head.weight``, EAGLE-3 ``norm.weight``.

Example::

    draft = load_eagle_draft(Path("eagle-converted"), torch.float32, target_layers=30)
    h = draft.from_target(target_hidden)                                # [B, T, H] (EAGLE-3: from [B, T, 3H])
    z, k, v = draft.forward_step(tokens, h, starts, k_cache, v_cache, 1)  # tokens [B, T]; caches [layers, B, kv, n, hd]
    logits = draft.logits(z[:, -1])                                     # [B, vocab] float32
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from neuronpack.errors import CheckpointError, UnsupportedModelError
from neuronpack.models.attention import Attention, StepMasks, causal_mask
from neuronpack.models.config import ModelConfig
from neuronpack.models.layers import Embedding, GatedMLP, Linear, RMSNorm
from neuronpack.models.registry import family
from neuronpack.models.rope import rope_cos_sin, rope_inv_freq

FC, HEAD, EMBED, NORM = "fc.weight", "lm_head.weight", "embed_tokens.weight", "norm.weight"
LAYER0_NORM = "layers.0.input_layernorm.weight"
HIDDEN_NORM = "layers.0.hidden_norm.weight"  # EAGLE-3's layer 0 (convert-eagle renames midlayer.* to layers.0.*)
# (tokens, hidden, cos, sin, past mask, k past, v past) -> (z, new k, new v): ``EagleDraft.forward`` or its graph
RunCore = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


class Eagle3FirstLayer(nn.Module):
    """EAGLE-3's layer 0: attention over cat(input_layernorm(embedding), hidden_norm(h)) [2H], h the residual."""

    def __init__(self, cfg: ModelConfig, norm_before_residual: bool) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.self_attn = Attention(cfg, frozenset(), "layers.0.self_attn")
        for name, heads in (("q_proj", cfg.num_heads), ("k_proj", cfg.num_kv_heads), ("v_proj", cfg.num_kv_heads)):
            setattr(self.self_attn, name, Linear(2 * h, heads * cfg.head_dim, bias=cfg.qkv_bias))
        self.mlp = GatedMLP(cfg, frozenset(), "layers.0.mlp")
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, x: Tensor, embedded: Tensor, cos: Tensor, sin: Tensor, masks: StepMasks, k_past, v_past):
        hidden = self.hidden_norm(x)
        residual = hidden if self.norm_before_residual else x
        attn_in = torch.cat((self.input_layernorm(embedded), hidden), dim=-1)
        attn, k, v = self.self_attn(attn_in, cos, sin, masks, k_past, v_past)
        x = residual + attn
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class EagleDraft(nn.Module):
    """An EAGLE draft (``eagle3``: EAGLE-3, else EAGLE-1/2). Build it with ``load_eagle_draft``.

    ``target_layers``: None when the draft reads the target's final-normed hidden states (EAGLE-1/2), else the
    target layers whose inputs it reads, in layer order (EAGLE-3)."""

    def __init__(self, cfg: ModelConfig, *, eagle3: bool, fc_bias: bool, layer0_norm: bool,
                 target_layers: tuple[int, ...] | None = None, norm_before_residual: bool = False) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.config, self.eagle3, self.target_layers = cfg, eagle3, target_layers
        self.embed_tokens = Embedding(cfg.vocab_size, h)
        self.fc = Linear((3 if eagle3 else 2) * h, h, bias=fc_bias)
        layers = family(cfg.family)  # the draft's own family (a Llama, whatever the target's)
        self.layers = nn.ModuleList(layers.decoder_layer(cfg, i, frozenset()) for i in range(cfg.num_layers))
        if eagle3:
            self.layers[0] = Eagle3FirstLayer(cfg, norm_before_residual)
            self.norm = RMSNorm(h, cfg.rms_norm_eps)
        elif not layer0_norm:  # EAGLE-1: the fc output enters layer 0 un-normed
            self.layers[0].input_layernorm = nn.Identity()
        self.lm_head = Linear(h, cfg.vocab_size)
        self.register_buffer("rope_inv_freq", rope_inv_freq(cfg.rope, cfg.head_dim), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        """The draft's compute dtype (its embedding's; an int8 linear's weight is int8)."""
        return self.embed_tokens.weight.dtype

    def from_target(self, hidden: Tensor) -> Tensor:
        """The draft's hidden input for verified positions from the target's hidden states (EAGLE-3: fc over the
        concatenated layer inputs [.., 3H] -> [.., H]; EAGLE-1/2: the final-normed states as they are)."""
        hidden = hidden.to(self.dtype)
        return self.fc(hidden) if self.eagle3 else hidden

    def forward_step(self, tokens: Tensor, hidden: Tensor, starts: Tensor, k_past: Tensor, v_past: Tensor,
                     n_past: int, run_core: RunCore | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """tokens [B, T] int64 and hidden [B, T, H] (``from_target`` states, or the draft's own outputs) at draft
        positions ``starts[i] + 0..T-1``; row i attends to its cached positions below ``starts[i]`` among the first
        ``n_past`` (>= 1) of k_past / v_past [layers, B, kv, n_past, hd], and causally to its own T.

        Returns (outputs z [B, T, H], the T pairs' keys and values [layers, B, kv, T, hd])."""
        b, t = tokens.shape
        positions = starts.view(b, 1) + torch.arange(t)
        past = (torch.arange(n_past)[None, :] < starts.view(b, 1))[:, None, None, :]
        cos, sin = rope_cos_sin(self.rope_inv_freq, positions, self.dtype)
        return (run_core or self)(tokens, hidden.to(self.dtype), cos, sin, past, k_past, v_past)

    def forward(self, tokens: Tensor, hidden: Tensor, cos: Tensor, sin: Tensor, past: Tensor, k_past: Tensor,
                v_past: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The part a compiled graph replaces (see ``forward_step``; past: bool [B, 1, 1, n_past])."""
        masks = StepMasks(past=past, new=causal_mask(tokens.shape[1], self.config.queries_per_kv))
        embedded = self.embed_tokens(tokens)
        if self.eagle3:
            x, k, v = self.layers[0](hidden, embedded, cos, sin, masks, k_past[0], v_past[0])
        else:
            x, k, v = self.layers[0](self.fc(torch.cat((embedded, hidden), dim=-1)), cos, sin, masks, k_past[0],
                                     v_past[0])
        new_k, new_v = [k], [v]
        for i in range(1, len(self.layers)):
            x, k, v = self.layers[i](x, cos, sin, masks, k_past[i], v_past[i])
            new_k.append(k)
            new_v.append(v)
        return x, torch.stack(new_k), torch.stack(new_v)

    def logits(self, z: Tensor) -> Tensor:
        """float32 [..., vocab]: EAGLE-1/2 the target's LM head over z; EAGLE-3 its own head over norm(z)."""
        return self.lm_head(self.norm(z) if self.eagle3 else z).float()


def target_layer_ids(hf: dict, target_layers: int) -> tuple[int, ...]:
    """The target layers whose inputs an EAGLE-3 draft reads: config ``eagle_aux_hidden_state_layer_ids``, else
    vLLM's default for Llama (2, L // 2, L - 3); each once, in layer order (as vLLM collects them)."""
    ids = hf.get("eagle_aux_hidden_state_layer_ids") or (2, target_layers // 2, target_layers - 3)
    return tuple(sorted({int(i) for i in ids}))


def load_eagle_draft(path: Path, dtype: torch.dtype, target_layers: int | None = None) -> EagleDraft:
    """Load a converted EAGLE draft (``neuronpack convert-eagle`` output) in ``dtype``. ``target_layers``: the
    target's layer count (EAGLE-3 reads three of its layers; required for EAGLE-3).

    CheckpointError when the target's head / embedding are missing (an unconverted draft), an EAGLE-3 draft was
    not converted, or a tensor does not fit config.json; UnsupportedModelError when an EAGLE-3 draft's layers do not
    fit the target."""
    from neuronpack.checkpoint import open_checkpoint

    ckpt = open_checkpoint(Path(path))
    names = set(ckpt.names())
    if {"d2t", "t2d"} & names or any(n.startswith("midlayer.") for n in names):
        raise CheckpointError("this EAGLE-3 draft is in its original layout (midlayer.*, d2t / t2d)", where=str(path),
                              fix="run: neuronpack convert-eagle --draft DRAFT --target TARGET --out DIR, and use DIR")
    if FC not in names:
        raise CheckpointError("not an EAGLE draft: it has no fc.weight", where=str(path),
                              fix="point [speculation] draft at an EAGLE draft checkpoint")
    missing = [n for n in (HEAD, EMBED) if n not in names]
    if missing:
        raise CheckpointError(f"the EAGLE draft has no {missing[0]} (the target's, added by convert-eagle)",
                              where=str(path),
                              fix="run: neuronpack convert-eagle --draft DRAFT --target TARGET --out DIR, and use DIR")
    eagle3 = HIDDEN_NORM in names
    cfg = dataclasses.replace(ModelConfig.from_hf(ckpt.config), tie_word_embeddings=False)
    layers = _eagle3_layers(ckpt.config, target_layers, cfg.hidden_size, ckpt.info(FC).shape, path) if eagle3 else None
    with torch.device("meta"):
        draft = EagleDraft(cfg, eagle3=eagle3, fc_bias="fc.bias" in names, layer0_norm=LAYER0_NORM in names,
                           target_layers=layers,
                           norm_before_residual=bool(ckpt.config.get("norm_before_residual"))).to(dtype)
    draft.rope_inv_freq = rope_inv_freq(cfg.rope, cfg.head_dim)
    tensors = {}
    for name, slot in draft.state_dict().items():
        if name not in names:
            raise CheckpointError(f"the EAGLE draft is missing tensor {name}", where=str(path),
                                  fix="check that config.json (num_hidden_layers, biases) belongs to these weights")
        tensor = ckpt.get(name).to(dtype)
        if tuple(tensor.shape) != tuple(slot.shape):
            raise CheckpointError(f"EAGLE draft tensor {name} has shape {tuple(tensor.shape)}, the config implies "
                                  f"{tuple(slot.shape)}", where=str(path),
                                  fix="check that config.json belongs to these weights")
        tensors[name] = tensor
    draft.load_state_dict(tensors, assign=True)
    return draft.eval()


def _eagle3_layers(hf: dict, target_layers: int | None, hidden: int, fc_shape, path: Path) -> tuple[int, ...]:
    if target_layers is None:
        raise UnsupportedModelError("an EAGLE-3 draft needs its target's layer count", where=str(path),
                                    fix="load it with target_layers (the artifact's num_layers)")
    ids = target_layer_ids(hf, target_layers)
    wanted = fc_shape[-1] // hidden  # fc: [H, k*H], k target layers (3 in EAGLE-3)
    named = ("its config's eagle_aux_hidden_state_layer_ids" if hf.get("eagle_aux_hidden_state_layer_ids")
             else f"vLLM's default (2, L // 2, L - 3) for this {target_layers}-layer target")
    fix = (f"set eagle_aux_hidden_state_layer_ids in the draft's config.json to {wanted} distinct layers of the "
           f"target (0 to {target_layers - 1})")
    if len(ids) != wanted or len(ids) * hidden != fc_shape[-1]:
        raise UnsupportedModelError(
            f"the EAGLE-3 draft reads {wanted} target layers (fc takes {fc_shape[-1]} = {wanted} x {hidden} inputs) "
            f"but {named} gives {len(ids)} distinct: {list(ids)}", where=f"{path}/config.json", fix=fix)
    if not all(0 <= i < target_layers for i in ids):
        raise UnsupportedModelError(
            f"the EAGLE-3 draft reads target layers {list(ids)} ({named}) but the target has {target_layers} layers "
            f"(0 to {target_layers - 1})", where=f"{path}/config.json", fix=fix)
    return ids
