"""The exported graphs of the portable backend: one per context bucket and one per token-generation bucket.

Every graph reads the same weights (constants named like the checkpoint tensors, under ``WEIGHT_PREFIX``) and
the same per-layer KV cache tensors ``[B, kv_heads, max_seq, head_dim]``, passed as inputs and written in place.

- ``context:<T>``: tokens [1, T], last_index [1], slot [1], k_caches, v_caches -> (logits [1, vocab] float32,
  final-normed hidden states [1, T, hidden]): the runtime heads the hidden states only for prompt logits
- ``token_generation:<L>``: tokens [B], positions [B], k_caches, v_caches -> logits [B, vocab] float32

Example::

    programs = export_graphs(model, plan, batch_size=4)      # {"context:128": ExportedProgram, ...}
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from neuronpack.backends.torch_aot.layout import CONTEXT, WEIGHT_PREFIX

# torch's own pytree pickling trips its LeafSpec deprecation once per exported graph; nothing a user can act on.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

if TYPE_CHECKING:
    from neuronpack.models.llama import LlamaForCausalLM

class ContextGraph(nn.Module):
    """A context-encoding bucket of ``length`` tokens (batch 1, like NxDI's ctx_batch_size 1)."""

    def __init__(self, lm: LlamaForCausalLM, length: int) -> None:
        super().__init__()
        self.lm, self.length = lm, length

    def forward(self, tokens: Tensor, last_index: Tensor, slot: Tensor, k_caches: list[Tensor],
                v_caches: list[Tensor]) -> Tensor:
        return self.lm.forward_context(tokens, last_index, slot, k_caches, v_caches, return_hidden=True)


class DecodeGraph(nn.Module):
    """A token-generation bucket attending to the first ``attend_len`` cache positions of every slot."""

    def __init__(self, lm: LlamaForCausalLM, attend_len: int) -> None:
        super().__init__()
        self.lm, self.attend_len = lm, attend_len

    def forward(self, tokens: Tensor, positions: Tensor, k_caches: list[Tensor], v_caches: list[Tensor]) -> Tensor:
        return self.lm.forward_decode(tokens, positions, k_caches, v_caches, self.attend_len)


def new_kv_cache(lm: LlamaForCausalLM, batch_size: int, max_seq: int, dtype: torch.dtype, device="cpu"):
    """Per-layer K and V caches, each ``[batch_size, kv_heads, max_seq, head_dim]`` zeros."""
    cfg = lm.config
    shape = (batch_size, cfg.num_kv_heads, max_seq, cfg.head_dim)
    k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
    v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
    return k, v


def example_inputs(kind: str, length: int, batch_size: int, caches) -> tuple:
    """Example arguments for one graph (their shapes are what gets compiled)."""
    k, v = caches
    if kind == CONTEXT:
        tokens = torch.zeros(1, length, dtype=torch.long)
        return tokens, torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), k, v
    return torch.zeros(batch_size, dtype=torch.long), torch.zeros(batch_size, dtype=torch.long), k, v


def export_graph(lm: LlamaForCausalLM, kind: str, length: int, batch_size: int, caches):
    """torch.export one bucket's graph (static shapes)."""
    module = ContextGraph(lm, length) if kind == CONTEXT else DecodeGraph(lm, length)
    with torch.no_grad():
        return torch.export.export(module, example_inputs(kind, length, batch_size, caches), strict=False)


class WeightsAsInputs(nn.Module):
    """Export-only flavour: the weights are the first argument (a dict), so the saved program holds none of them.

    The wrapped graph's model lives on the meta device and is hidden from module registration, so export lifts
    no parameters; ``functional_call`` swaps the real tensors in for each call.
    """

    def __init__(self, graph: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_graph", graph)  # not a submodule: its (meta) tensors must not be saved

    def forward(self, weights: dict[str, Tensor], *args):
        return torch.func.functional_call(self._graph, weights, args, tie_weights=False, strict=True)


def export_weightless_graph(lm: LlamaForCausalLM, kind: str, length: int, batch_size: int, caches):
    """torch.export one bucket with weights as inputs (keys ``lm.<checkpoint name>``); see ``WeightsAsInputs``."""
    from neuronpack.models.llama import build_model
    from neuronpack.models.loading import model_tensors

    meta = build_model(lm.config, lm.model.embed_tokens.weight.dtype, _int8_prefixes(lm))
    graph = ContextGraph(meta, length) if kind == CONTEXT else DecodeGraph(meta, length)
    weights = {WEIGHT_PREFIX + name: t for name, t in model_tensors(lm).items()}
    args = (weights, *example_inputs(kind, length, batch_size, caches))
    with torch.no_grad():
        return torch.export.export(WeightsAsInputs(graph), args, strict=False)


def _int8_prefixes(lm: LlamaForCausalLM) -> frozenset[str]:
    from neuronpack.models.quant import Int8Linear

    return frozenset(name for name, mod in lm.named_modules() if isinstance(mod, Int8Linear))
