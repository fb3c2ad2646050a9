"""The EAGLE draft's graphs (``[speculation] kind = "eagle"``), compiled next to the target's and run by the
proposer in place of the draft's eager modules. Like the target's layer graphs they take the draft's weights as
inputs (the artifact stores them once, in ``draft/``) and have dynamic shapes:

- ``draft_step``: ``EagleDraft.forward``: tokens [b, T], hidden [b, T, H], cos/sin [b, T, hd], past mask
  [b, 1, 1, L], k/v past [layers, b, kv, L, hd] -> (z [b, T, H], new k, v [layers, b, kv, T, hd]); b in 1..B
  running sequences, T in 1..max_tokens (a catch-up over a prompt, or one pair per further draft), L in 1..max_seq
- ``draft_head``: ``EagleDraft.logits``: z [b, H] -> (float32 logits [b, vocab],)

Exported with ``kernels=True`` (an artifact's ``linear_kernels``) their linears call neuronpack's decode kernels,
as the target's graphs do (models/linear_kernels.py).

Example::

    programs = {name: export_draft_graph(draft, name, limits, kernels=True) for name in DRAFT_GRAPHS}
    graphs = CompiledDraft(runners, draft, limits.max_tokens)      # at load: what EagleProposer(graphs=) runs
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from neuronpack.backends.torch_aot.graphs import GraphLimits, WeightsAsInputs
from neuronpack.backends.torch_aot.layout import DRAFT_GRAPHS, DRAFT_HEAD, DRAFT_STEP

if TYPE_CHECKING:
    from neuronpack.models.eagle import EagleDraft

__all__ = ["DRAFT_GRAPHS", "CompiledDraft", "draft_weights", "export_draft_graph"]


class DraftHead(nn.Module):
    """EAGLE-3: lm_head(norm(z)); EAGLE-1/2: lm_head(z) (names ``norm.weight``, ``lm_head.weight``: the draft's)."""

    def __init__(self, draft: EagleDraft) -> None:
        super().__init__()
        self.norm = draft.norm if draft.eagle3 else nn.Identity()
        self.lm_head = draft.lm_head

    def forward(self, z: Tensor) -> tuple[Tensor]:
        return (self.lm_head(self.norm(z)).float(),)  # a tuple, as every graph's outputs


class DraftStepGraph(WeightsAsInputs):
    """(weights, tokens, hidden, cos, sin, past, k past, v past) -> (z, new k, new v): ``EagleDraft.forward``."""

    def forward(self, weights: dict[str, Tensor], tokens: Tensor, hidden: Tensor, cos: Tensor, sin: Tensor,
                past: Tensor, k_past: Tensor, v_past: Tensor):
        return self.call(weights, tokens, hidden, cos, sin, past, k_past, v_past)


class DraftHeadGraph(WeightsAsInputs):
    """(weights, z) -> logits."""

    def forward(self, weights: dict[str, Tensor], z: Tensor):
        return self.call(weights, z)


def draft_weights(draft: EagleDraft, name: str) -> dict[str, Tensor]:
    """The tensors graph ``name`` takes, in input order (by their names in the draft checkpoint)."""
    module = draft if name == DRAFT_STEP else DraftHead(draft)
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def export_draft_graph(draft: EagleDraft, name: str, limits: GraphLimits, kernels: bool = False):
    """torch.export the draft graph ``name`` (``DRAFT_GRAPHS``) with its dynamic dimensions; weights are inputs (the
    linears call neuronpack's kernels when ``kernels``)."""
    module, args, shapes = _graph_and_inputs(draft, name, limits, kernels)
    with torch.no_grad():
        return torch.export.export(module, args, strict=False, dynamic_shapes=shapes)


def _graph_and_inputs(draft: EagleDraft, name: str, limits: GraphLimits, kernels: bool):
    from neuronpack.backends.torch_aot.graphs import _dim, _example_size

    cfg = draft.config
    dtype = draft.dtype
    meta = _meta_copy(draft)
    if kernels:
        from neuronpack.models.linear_kernels import use_kernels

        use_kernels(meta)
    module = meta if name == DRAFT_STEP else DraftHead(meta)
    weights = draft_weights(draft, name)
    b, batch = _example_size(limits.batch_size), _dim("batch", limits.batch_size)
    fixed = {n: None for n in weights}
    if name == DRAFT_HEAD:
        return DraftHeadGraph(module), (weights, torch.zeros(b, cfg.hidden_size, dtype=dtype)), (fixed, {0: batch})
    t, tokens = _example_size(limits.max_tokens), _dim("tokens", limits.max_tokens)
    n, attend = _example_size(limits.max_seq), _dim("attend_len", limits.max_seq)
    rope = torch.zeros(b, t, cfg.head_dim, dtype=dtype)
    past_kv = torch.zeros(cfg.num_layers, b, cfg.num_kv_heads, n, cfg.head_dim, dtype=dtype)
    args = (weights, torch.zeros(b, t, dtype=torch.long), torch.zeros(b, t, cfg.hidden_size, dtype=dtype), rope,
            rope.clone(), torch.ones(b, 1, 1, n, dtype=torch.bool), past_kv, past_kv.clone())
    row = {0: batch, 1: tokens}
    shapes = (fixed, row, row, row, row, {0: batch, 3: attend}, {1: batch, 3: attend}, {1: batch, 3: attend})
    return DraftStepGraph(module), args, shapes


def _meta_copy(draft: EagleDraft) -> EagleDraft:
    """The draft's structure on the meta device (the graphs hold no weights)."""
    from neuronpack.models.eagle import EagleDraft
    from neuronpack.models.rope import rope_inv_freq

    with torch.device("meta"):
        meta = EagleDraft(draft.config, eagle3=draft.eagle3, fc_bias=draft.fc.bias is not None,
                          layer0_norm=not isinstance(draft.layers[0].input_layernorm, nn.Identity),
                          target_layers=draft.target_layers,
                          norm_before_residual=getattr(draft.layers[0], "norm_before_residual", False))
    meta = meta.to(draft.dtype)
    meta.rope_inv_freq = rope_inv_freq(draft.config.rope, draft.config.head_dim)
    return meta.eval()


class CompiledDraft:
    """The draft graphs bound to a loaded draft's tensors: ``core`` and ``logits`` as ``EagleProposer`` runs them.
    A catch-up longer than the graphs' ``max_tokens`` runs the draft's own module. ``kernels``: the graphs call
    neuronpack's kernels, which are registered here (the draft's eager module then runs them too)."""

    def __init__(self, runners: dict[str, Callable], draft: EagleDraft, max_tokens: int, kernels: bool = False) -> None:
        if kernels:
            from neuronpack.models.linear_kernels import use_kernels

            use_kernels(draft)
        self._step, self._head = runners[DRAFT_STEP], runners[DRAFT_HEAD]
        self._step_inputs, self._head_inputs = draft_weights(draft, DRAFT_STEP), draft_weights(draft, DRAFT_HEAD)
        self._draft, self.max_tokens = draft, max_tokens

    def core(self, tokens: Tensor, *args) -> tuple[Tensor, Tensor, Tensor]:
        if tokens.shape[1] > self.max_tokens:
            return self._draft(tokens, *args)
        return self._step(self._step_inputs, tokens, *args)

    def logits(self, z: Tensor) -> Tensor:
        return self._head(self._head_inputs, z)[0]
