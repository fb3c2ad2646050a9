"""The exported graphs of the portable backend: one context-encoding graph and one token-generation graph, each
compiled once with dynamic shapes (``torch.export.Dim``), so one graph serves every prompt count and length and
every number of active rows and attention length: a lone request costs a batch-1 step, not a full-batch one.

Every graph reads the same weights (constants named like the checkpoint tensors, under ``WEIGHT_PREFIX``) and
the same per-layer KV cache tensors ``[B, kv_heads, max_seq + 1, head_dim]`` (one spare position, see
``cache_positions``), passed as inputs and written in place.

- ``context``: tokens [N, T], last_index [N], slots [N], k_caches, v_caches (all B rows) -> (logits [N, vocab]
  float32, final-normed hidden states [N, T, hidden]): N in 1..B prompts right padded to T in 1..max_context_length
  tokens, one graph call; the runtime heads the hidden states only for prompt logits
- ``token_generation``: tokens [b], positions [b], key_positions [L], k_caches, v_caches (rows 0..b-1: views
  ``cache[:b]``) -> logits [b, vocab]; b in 1..B active rows, L in 1..max_seq attended positions (``arange(L)``)

Example::

    program = export_graph(model, CONTEXT, GraphLimits(batch_size=4, max_context=512, max_seq=1024), caches)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from neuronpack.backends.torch_aot.layout import CONTEXT, WEIGHT_PREFIX, cache_positions

# torch's own pytree pickling trips its LeafSpec deprecation once per exported graph; nothing a user can act on.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

if TYPE_CHECKING:
    from neuronpack.models.llama import LlamaForCausalLM


@dataclass(frozen=True)
class GraphLimits:
    """The ranges the dynamic dimensions are compiled for."""

    batch_size: int  # KV cache rows: prompts per context call and active rows per decode step, 1..batch_size
    max_context: int  # prompt tokens per context call, 1..max_context
    max_seq: int  # cache length: attended positions per decode step, 1..max_seq


class ContextGraph(nn.Module):
    """Context encoding of N prompts (right padded to T tokens) into the cache rows ``slots``."""

    def __init__(self, lm: LlamaForCausalLM) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, tokens: Tensor, last_index: Tensor, slots: Tensor, k_caches: list[Tensor],
                v_caches: list[Tensor]) -> Tensor:
        return self.lm.forward_context(tokens, last_index, slots, k_caches, v_caches, return_hidden=True)


class DecodeGraph(nn.Module):
    """One decode step of rows 0..b-1, attending to the first ``key_positions.shape[0]`` cache positions."""

    def __init__(self, lm: LlamaForCausalLM) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, tokens: Tensor, positions: Tensor, key_positions: Tensor, k_caches: list[Tensor],
                v_caches: list[Tensor]) -> Tensor:
        return self.lm.forward_decode(tokens, positions, k_caches, v_caches, key_positions.shape[0])


def new_kv_cache(lm: LlamaForCausalLM, batch_size: int, max_seq: int, dtype: torch.dtype, device="cpu"):
    """Per-layer K and V caches, each ``[batch_size, kv_heads, cache_positions(max_seq), head_dim]`` zeros."""
    cfg = lm.config
    shape = (batch_size, cfg.num_kv_heads, cache_positions(max_seq), cfg.head_dim)
    k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
    v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
    return k, v


def _example_size(limit: int) -> int:
    # export specialises sizes 0 and 1: trace with 2 (or the limit when it is smaller) and declare 1..limit.
    return min(2, limit)


def example_inputs(kind: str, limits: GraphLimits, caches) -> tuple:
    """Example arguments for one graph; with ``dynamic_shapes(kind, limits, caches)`` they define what compiles."""
    k, v = caches
    n = _example_size(limits.batch_size)
    if kind == CONTEXT:
        tokens = torch.zeros(n, _example_size(limits.max_context), dtype=torch.long)
        return tokens, torch.zeros(n, dtype=torch.long), torch.arange(n), k, v
    rows = ([c[:n] for c in k], [c[:n] for c in v])
    key_positions = torch.arange(_example_size(limits.max_seq))
    return torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long), key_positions, *rows


def _dim(name: str, limit: int):
    return torch.export.Dim(name, min=1, max=limit) if limit > 1 else None


def dynamic_shapes(kind: str, limits: GraphLimits, caches) -> tuple:
    """The dynamic dimensions of ``example_inputs`` (a size limited to 1 stays static)."""
    layers = len(caches[0])
    batch = _dim("batch", limits.batch_size)
    if kind == CONTEXT:
        static = [None] * layers
        tokens = {0: batch, 1: _dim("prompt_len", limits.max_context)}
        return tokens, {0: batch} if batch else None, {0: batch} if batch else None, static, static
    rows = [{0: batch} if batch else None] * layers
    row = {0: batch} if batch else None
    return row, row, {0: _dim("attend_len", limits.max_seq)} if limits.max_seq > 1 else None, rows, rows


def graph_module(lm: LlamaForCausalLM, kind: str) -> nn.Module:
    return ContextGraph(lm) if kind == CONTEXT else DecodeGraph(lm)


def export_graph(lm: LlamaForCausalLM, kind: str, limits: GraphLimits, caches):
    """torch.export one graph with its dynamic dimensions."""
    with torch.no_grad():
        return torch.export.export(graph_module(lm, kind), example_inputs(kind, limits, caches), strict=False,
                                   dynamic_shapes=dynamic_shapes(kind, limits, caches))


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


def export_weightless_graph(lm: LlamaForCausalLM, kind: str, limits: GraphLimits, caches):
    """torch.export one graph with weights as inputs (keys ``lm.<checkpoint name>``); see ``WeightsAsInputs``."""
    from neuronpack.models.llama import build_model
    from neuronpack.models.loading import model_tensors

    meta = build_model(lm.config, lm.model.embed_tokens.weight.dtype, _int8_prefixes(lm))
    weights = {WEIGHT_PREFIX + name: t for name, t in model_tensors(lm).items()}
    args = (weights, *example_inputs(kind, limits, caches))
    shapes = ({name: None for name in weights}, dynamic_shapes(kind, limits, caches))  # (weights, *args)
    with torch.no_grad():
        return torch.export.export(WeightsAsInputs(graph_module(meta, kind)), args, strict=False,
                                   dynamic_shapes=shapes)


def _int8_prefixes(lm: LlamaForCausalLM) -> frozenset[str]:
    from neuronpack.models.quant import Int8Linear

    return frozenset(name for name, mod in lm.named_modules() if isinstance(mod, Int8Linear))
