"""The EAGLE-1/2 draft model (eager PyTorch), loaded from a draft as ``neuronpack convert-eagle`` writes it.

EAGLE (Li et al. 2024; SafeAILab/EAGLE ``cnets1.py``) drafts at the feature level. Draft position j reads the pair
(token x_{j+1}, the target's final-normed hidden state h_j at position j) and predicts x_{j+2}:

    z = fc(cat(embed_tokens(x_{j+1}), h_j))          fc: Linear(2H -> H), bias when the draft has fc.bias
    z = layers(z)                                     decoder layer(s) of the target's architecture; layer 0 has no
                                                      input_layernorm (unless the draft ships one)
    logits = lm_head(z)                               the target's LM head (convert-eagle adds it); no final norm

Drafting k tokens after the pairs the target verified: the last output z gives d1 = argmax(lm_head(z)); then the pair
(d1, z) (the draft's own output stands in for the target's hidden state) gives d2, and so on. The draft keeps its own
KV cache (one position per pair, RoPE at the pair's position j); tentative positions are overwritten once the target
has verified them. The layer, norm, RoPE and attention code are ``neuronpack.models.llama``'s (one implementation).

Converted-draft tensors: ``embed_tokens.weight``, ``fc.weight`` (+ ``fc.bias``), ``layers.N.*``, ``lm_head.weight``.
EAGLE-3 drafts (``layers.0.hidden_norm``, fc over three target layers, d2t/t2d vocabularies) are refused for now.

Example::

    draft = load_eagle_draft(Path("eagle-converted"), torch.float32)
    z, k, v = draft.forward_step(tokens, target_hidden, starts, None, None, 0)   # tokens [B, T], hidden [B, T, H]
    draft.logits(z[:, -1])                                                      # [B, vocab] float32
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from neuronpack.errors import CheckpointError, UnsupportedModelError
from neuronpack.models.config import ModelConfig
from neuronpack.models.llama import DecoderLayer, Embedding, Linear, StepMasks, causal_mask, rope_cos_sin, rope_inv_freq

FC, HEAD, EMBED = "fc.weight", "lm_head.weight", "embed_tokens.weight"
LAYER0_NORM = "layers.0.input_layernorm.weight"


class EagleDraft(nn.Module):
    """EAGLE-1/2 draft: ``fc`` over [embedding, target hidden], ``layers`` (layer 0 without input norm), ``lm_head``.
    Build it with ``load_eagle_draft``."""

    def __init__(self, cfg: ModelConfig, *, fc_bias: bool, layer0_norm: bool) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.config = cfg
        self.embed_tokens = Embedding(cfg.vocab_size, h)
        self.fc = Linear(2 * h, h, bias=fc_bias)
        self.layers = nn.ModuleList(DecoderLayer(cfg, frozenset(), i) for i in range(cfg.num_layers))
        if not layer0_norm:  # EAGLE: the fc output enters layer 0 un-normed
            self.layers[0].input_layernorm = nn.Identity()
        self.lm_head = Linear(h, cfg.vocab_size)
        self.register_buffer("rope_inv_freq", rope_inv_freq(cfg), persistent=False)

    def forward_step(self, tokens: Tensor, hidden: Tensor, starts: Tensor, k_caches: Sequence[Tensor] | None,
                     v_caches: Sequence[Tensor] | None, n_past: int) -> tuple[Tensor, Tensor, Tensor]:
        """tokens [B, T] int64 and hidden [B, T, H] (the pairs' target hidden states) at draft positions
        ``starts[i] + 0..T-1``; row i attends to its cached positions below ``starts[i]`` (among the first ``n_past``
        of ``k_caches[layer]`` [B, kv, >= n_past, hd]; ``n_past`` 0: no cache read) and causally to its own T.

        Returns (output hidden states [B, T, H], the T pairs' keys and values [layers, B, kv, T, hd])."""
        b, t = tokens.shape
        positions = starts.view(b, 1) + torch.arange(t)
        past = None
        if n_past:
            past = (torch.arange(n_past)[None, :] < starts.view(b, 1))[:, None, None, :]
        masks = StepMasks(past=past, new=causal_mask(t, self.config.queries_per_kv))
        x = self.fc(torch.cat((self.embed_tokens(tokens), hidden.to(self.fc.weight.dtype)), dim=-1))
        cos, sin = rope_cos_sin(self.rope_inv_freq, positions, x.dtype)
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            k_past = k_caches[i][:, :, :n_past] if n_past else None
            v_past = v_caches[i][:, :, :n_past] if n_past else None
            x, k, v = layer(x, cos, sin, masks, k_past, v_past)
            new_k.append(k)
            new_v.append(v)
        return x, torch.stack(new_k), torch.stack(new_v)

    def logits(self, hidden: Tensor) -> Tensor:
        """The target's LM head over draft outputs (no final norm, as in EAGLE-1/2): float32 [..., vocab]."""
        return self.lm_head(hidden).float()


def load_eagle_draft(path: Path, dtype: torch.dtype) -> EagleDraft:
    """Load a converted EAGLE-1/2 draft (``neuronpack convert-eagle`` output) in ``dtype``.

    CheckpointError when the target's head / embedding are missing (an unconverted draft) or a tensor does not fit
    config.json; UnsupportedModelError for EAGLE-3 drafts."""
    from neuronpack.checkpoint import open_checkpoint

    ckpt = open_checkpoint(Path(path))
    names = set(ckpt.names())
    # The structure this module builds: an fc over [embedding, hidden] and plain decoder layers. (convert-eagle has
    # already classified the draft; EAGLE-3's midlayer / d2t / t2d tensors are a different model.)
    if {"d2t", "t2d"} & names or any(n.startswith("midlayer.") for n in names):
        raise UnsupportedModelError("EAGLE-3 drafts are not supported by the portable runtime yet", where=str(path),
                                    fix="use an EAGLE-1/2 draft, or framework nxd for EAGLE-3")
    if "fc.weight" not in names:
        raise CheckpointError("not an EAGLE-1/2 draft: it has no fc.weight", where=str(path),
                              fix="point [speculation] draft at an EAGLE draft checkpoint")
    missing = [n for n in (HEAD, EMBED) if n not in names]
    if missing:
        raise CheckpointError(f"the EAGLE draft has no {missing[0]} (the target's, added by convert-eagle)",
                              where=str(path),
                              fix="run: neuronpack convert-eagle --draft DRAFT --target TARGET --out DIR, and use DIR")
    cfg = dataclasses.replace(ModelConfig.from_hf(ckpt.config), tie_word_embeddings=False)
    with torch.device("meta"):
        draft = EagleDraft(cfg, fc_bias="fc.bias" in names, layer0_norm=LAYER0_NORM in names).to(dtype)
    draft.rope_inv_freq = rope_inv_freq(cfg)
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
