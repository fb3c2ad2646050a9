"""The exported graph of the portable backend: one step graph, compiled once with dynamic shapes
(``torch.export.Dim``), serving prefill, decode and speculative verification at every batch and length: a lone
request costs a batch-1 step, not a full-batch one.

The graph reads the weights (constants named like the checkpoint tensors, under ``WEIGHT_PREFIX``) and the first
rows of the per-layer KV caches ``[B, kv_heads, max_seq + 1, head_dim]`` (one spare position, see
``cache_positions``), read only: it returns the new K/V and the runtime stores them (``store_kv``).

- ``step``: tokens [b, T], starts [b], key_positions [L], logit_index [b, J], k_caches, v_caches (views
  ``cache[:b]``) -> (logits [b, J, vocab] float32, final-normed hidden [b, T, hidden], new keys and values
  [layers, b, kv, T, hd]); b in 1..B rows, T in 1..max_tokens tokens per row (the longest prompt, or more when
  verification needs it), L in 1..max_seq attended cache positions (``arange(L)``), J in 1..max_tokens logits per
  row (1 for prefill and decode, T for verification).

Example::

    program = export_graph(model, GraphLimits(batch_size=4, max_tokens=512, max_seq=1024), caches)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from neuronpack.backends.torch_aot.layout import WEIGHT_PREFIX, cache_positions

# torch's own pytree pickling trips its LeafSpec deprecation once per exported graph; nothing a user can act on.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

if TYPE_CHECKING:
    from neuronpack.models.llama import LlamaForCausalLM


@dataclass(frozen=True)
class GraphLimits:
    """The ranges the dynamic dimensions are compiled for."""

    batch_size: int  # KV cache rows: rows per step, 1..batch_size
    max_tokens: int  # tokens per row per step, and logits per row (the longest prompt, verification), 1..max_tokens
    max_seq: int  # cache length: attended positions per step, 1..max_seq


class StepGraph(nn.Module):
    """One step over rows 0..b-1: T tokens each from its own start, attending to ``key_positions.shape[0]`` cached
    positions (see ``LlamaForCausalLM.forward_step``)."""

    def __init__(self, lm: LlamaForCausalLM) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, tokens: Tensor, starts: Tensor, key_positions: Tensor, logit_index: Tensor,
                k_caches: list[Tensor], v_caches: list[Tensor]):
        return self.lm.forward_step(tokens, starts, key_positions.shape[0], k_caches, v_caches, logit_index)


def new_kv_cache(lm: LlamaForCausalLM, batch_size: int, max_seq: int, dtype: torch.dtype, device="cpu"):
    """Stacked K and V caches, each ``[layers, batch_size, kv_heads, cache_positions(max_seq), head_dim]`` zeros
    (layer l's cache is the contiguous ``cache[l]``)."""
    cfg = lm.config
    shape = (cfg.num_layers, batch_size, cfg.num_kv_heads, cache_positions(max_seq), cfg.head_dim)
    return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)


def _example_size(limit: int) -> int:
    # export specialises sizes 0 and 1: trace with 2 (or the limit when it is smaller) and declare 1..limit.
    return min(2, limit)


def example_inputs(limits: GraphLimits, caches) -> tuple:
    """Example arguments of the step graph; with ``dynamic_shapes(limits, caches)`` they define what compiles."""
    k, v = caches
    n, t = _example_size(limits.batch_size), _example_size(limits.max_tokens)
    j = t
    tokens = torch.zeros(n, t, dtype=torch.long)
    logit_index = torch.arange(j).expand(n, j).contiguous()
    key_positions = torch.arange(_example_size(limits.max_seq))
    return tokens, torch.zeros(n, dtype=torch.long), key_positions, logit_index, [c[:n] for c in k], [c[:n] for c in v]


def _dim(name: str, limit: int):
    return torch.export.Dim(name, min=1, max=limit) if limit > 1 else torch.export.Dim.STATIC


def dynamic_shapes(limits: GraphLimits, caches) -> tuple:
    """The dynamic dimensions of ``example_inputs`` (a size limited to 1 is static)."""
    layers = len(caches[0])
    batch, tokens = _dim("batch", limits.batch_size), _dim("tokens", limits.max_tokens)
    logits = _dim("logits", limits.max_tokens)
    row = {0: batch}
    rows = [row] * layers
    key_positions = {0: _dim("attend_len", limits.max_seq)}
    return {0: batch, 1: tokens}, row, key_positions, {0: batch, 1: logits}, rows, rows


def export_graph(lm: LlamaForCausalLM, limits: GraphLimits, caches):
    """torch.export the step graph with its dynamic dimensions."""
    with torch.no_grad():
        return torch.export.export(StepGraph(lm), example_inputs(limits, caches), strict=False,
                                   dynamic_shapes=dynamic_shapes(limits, caches))


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


def export_weightless_graph(lm: LlamaForCausalLM, limits: GraphLimits, caches):
    """torch.export the step graph with weights as inputs (keys ``lm.<checkpoint name>``); see ``WeightsAsInputs``."""
    from neuronpack.models.llama import build_model
    from neuronpack.models.loading import model_tensors

    meta = build_model(lm.config, lm.model.embed_tokens.weight.dtype, _int8_prefixes(lm))
    weights = {WEIGHT_PREFIX + name: t for name, t in model_tensors(lm).items()}
    args = (weights, *example_inputs(limits, caches))
    shapes = ({name: None for name in weights}, dynamic_shapes(limits, caches))  # (weights, *args)
    with torch.no_grad():
        return torch.export.export(WeightsAsInputs(StepGraph(meta)), args, strict=False,
                                   dynamic_shapes=shapes)


def _int8_prefixes(lm: LlamaForCausalLM) -> frozenset[str]:
    from neuronpack.models.quant import Int8Linear

    return frozenset(name for name, mod in lm.named_modules() if isinstance(mod, Int8Linear))
