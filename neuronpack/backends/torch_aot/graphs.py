"""The exported graphs of the portable backend: one decoder layer and the LM head, each compiled once with dynamic
shapes (``torch.export.Dim``) and run by ``CausalLM.forward_step`` (models/decoder.py) in place of its own modules,
for every layer, every kind of step (prefill, decode, speculative verification), every batch and every length.

Every layer of a model has the same code, so one compiled layer serves all of them: each call gets that layer's
weights as inputs. This compiles in a fraction of the time a whole-model graph took (the model's layers were
lowered and compiled one by one there) for the cost of one graph call per layer per step. No graph writes the
KV cache: a layer reads its cache rows and returns the keys and values of the tokens it ran (``store_kv``).

- ``layer_step``: x [b, T, H], cos/sin [b, T, hd], past mask [b, 1, 1, L], k/v cache rows [b, kv, S, hd] (views
  ``cache[l, :b]``) -> (x [b, T, H], k, v [b, kv, T, hd]); b in 1..B rows, T in 1..max_tokens, L in 1..max_seq
- ``layer_decode``: the same with T = 1 (decode steps: static shapes the compiler specialises, e.g. int8 GEMV)
- ``head``: hidden [b, T, H], logit_index [b, J] -> (float32 logits [b, J, vocab], final-normed hidden [b, T, H])

A sliding-window layer's graph takes a past mask per token, [b, 1, T, L] (each token's window), and, when the
artifact keeps only the window (``GraphLimits.ring``), cache rows [b, kv, ring + 1, hd] of which L in 1..ring slots
are read. Layers whose attention kind or tensors differ (Gemma 3's sliding and global layers; a quantization
``skip`` keeps some float) get a layer graph pair per kind of layer: ``layer_step.1`` and so on (``layer_groups``).

With LoRA (``[lora]``) a layer's tensors include its ``lora_A`` / ``lora_B`` stacks and both layer graphs take one
more input, the per-row adapter mask [b, 1, max_loras * max_rank] (``LoraLayerGraph``; see models/lora.py).

Exported with ``kernels=True`` (an artifact's ``linear_kernels``), the graphs' linears call neuronpack's decode
kernels (``torch.ops.neuronpack.linear`` / ``linear_int8``, models/linear_kernels.py) by name; AOTInductor leaves
those calls to the op registered in the process that runs the graph.

Example::

    limits = GraphLimits(batch_size=4, max_tokens=512, max_seq=1024)
    programs = {name: export_graph(model, name, limits) for name in graph_names(layer_groups(model))}
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from neuronpack.backends.torch_aot.layout import HEAD, LAYER_DECODE, LAYER_STEP, cache_positions

# torch's own pytree pickling trips its LeafSpec deprecation once per exported graph; nothing a user can act on.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

if TYPE_CHECKING:
    from neuronpack.models.decoder import CausalLM


@dataclass(frozen=True)
class GraphLimits:
    """The ranges the dynamic dimensions are compiled for."""

    batch_size: int  # KV cache rows: rows per step, 1..batch_size
    max_tokens: int  # tokens per row per step, and logits per row (the longest prompt, verification), 1..max_tokens
    max_seq: int  # cache length: attended positions per step, 1..max_seq
    ring: int | None = None  # a sliding-window layer's ring of positions (ArtifactConfig.kv_ring), 1..ring read


class WeightsAsInputs(nn.Module):
    """A module whose weights are the first argument (a dict), so the saved program holds none of them and one
    program serves every layer. The module lives on the meta device and is hidden from module registration
    (export lifts no parameters); ``functional_call`` swaps the given tensors in for each call."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_module", module)

    def call(self, weights: dict[str, Tensor], *args):
        return torch.func.functional_call(self._module, weights, args, tie_weights=False, strict=True)


class LayerGraph(WeightsAsInputs):
    """A decoder layer: (weights, x, cos, sin, past mask, k rows, v rows) -> (x, k, v)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        object.__setattr__(self, "_attention", layer.self_attn)  # makes the step's own-token mask (its window)

    def forward(self, weights: dict[str, Tensor], x: Tensor, cos: Tensor, sin: Tensor, past: Tensor,
                k_rows: Tensor, v_rows: Tensor):
        return self.call(weights, x, cos, sin, self._masks(past, x), k_rows, v_rows)

    def _masks(self, past: Tensor, x: Tensor):
        from neuronpack.models.attention import StepMasks

        return StepMasks(past=past, new=self._attention.new_mask(x.shape[1]))


class LoraLayerGraph(LayerGraph):
    """A decoder layer with LoRA: (weights, x, cos, sin, past mask, k rows, v rows, adapter mask) -> (x, k, v)."""

    def forward(self, weights: dict[str, Tensor], x: Tensor, cos: Tensor, sin: Tensor, past: Tensor,
                k_rows: Tensor, v_rows: Tensor, lora: Tensor):
        return self.call(weights, x, cos, sin, self._masks(past, x), k_rows, v_rows, lora)


class FinalHead(nn.Module):
    """The final norm and the LM head (names ``norm.*``, ``lm_head.*``), logits soft-capped when ``softcap``."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module, softcap: float | None = None) -> None:
        super().__init__()
        self.norm, self.lm_head, self.softcap = norm, lm_head, softcap

    def forward(self, hidden: Tensor, logit_index: Tensor):
        from neuronpack.models.decoder import lm_head_at

        return lm_head_at(self.norm, self.lm_head, hidden, logit_index, self.softcap)


class HeadGraph(WeightsAsInputs):
    """(weights, hidden, logit_index) -> (logits, normed hidden)."""

    def forward(self, weights: dict[str, Tensor], hidden: Tensor, logit_index: Tensor):
        return self.call(weights, hidden, logit_index)


def layer_weights(lm: CausalLM, index: int) -> dict[str, Tensor]:
    """Layer ``index``'s tensors by their name inside the layer (``self_attn.q_proj.weight``), graph input order."""
    layer = lm.model.layers[index]
    return {**dict(layer.named_parameters()), **dict(layer.named_buffers())}


def head_weights(lm: CausalLM) -> dict[str, Tensor]:
    """The head graph's tensors (``norm.weight``, ``lm_head.weight`` (the embedding when tied), int8 scale)."""
    head = FinalHead(lm.model.norm, lm.lm_head)
    return {**dict(head.named_parameters(remove_duplicate=False)), **dict(head.named_buffers())}


def layer_groups(lm: CausalLM) -> list[int]:
    """For each layer, the index of its kind: layers of one attention kind (full, sliding window) and FFN kind whose
    tensors have the same names, shapes and dtypes share one graph (all of them in a dense model without sliding
    windows, unless a quantization skip keeps some layers' linears float)."""
    kinds: dict[tuple, int] = {}
    groups = []
    cfg = lm.config
    for i in range(len(lm.model.layers)):
        signature = (cfg.layer_kind(i), cfg.ffn_kind(i),
                     *((n, tuple(t.shape), t.dtype) for n, t in layer_weights(lm, i).items()))
        groups.append(kinds.setdefault(signature, len(kinds)))
    return groups


def graph_names(groups: list[int]) -> list[str]:
    """Graph names of an artifact: ``layer_decode``/``layer_step`` (suffixed ``.g`` for layer kinds g > 0), ``head``."""
    names = []
    for g in sorted(set(groups)):
        suffix = f".{g}" if g else ""
        names += [LAYER_DECODE + suffix, LAYER_STEP + suffix]
    return [*names, HEAD]


def _example_size(limit: int) -> int:
    # export specialises sizes 0 and 1: trace with 2 (or the limit when it is smaller) and declare 1..limit.
    return min(2, limit)


def _dim(name: str, limit: int):
    return torch.export.Dim(name, min=1, max=limit) if limit > 1 else torch.export.Dim.STATIC


def _graph_and_inputs(lm: CausalLM, name: str, limits: GraphLimits, kernels: bool):
    """(module, example args, dynamic shapes) of graph ``name``; ``kernels``: its linears call neuronpack's
    kernels."""
    from neuronpack.models.decoder import build_model

    cfg = lm.config
    dtype = lm.model.embed_tokens.weight.dtype
    meta = build_model(cfg, dtype, _int8_prefixes(lm))  # structure only: weights are inputs
    if lm.lora_layout is not None:
        from neuronpack.models.lora import attach_lora

        attach_lora(meta, lm.lora_layout, device="meta")
    if kernels:
        from neuronpack.models.linear_kernels import use_kernels

        use_kernels(meta)
    b, t = _example_size(limits.batch_size), _example_size(limits.max_tokens)
    batch, tokens = _dim("batch", limits.batch_size), _dim("tokens", limits.max_tokens)
    if name == HEAD:
        head = FinalHead(meta.model.norm, meta.lm_head, cfg.final_softcap)
        weights = head_weights(lm)
        hidden = torch.zeros(b, t, cfg.hidden_size, dtype=dtype)
        index = torch.arange(t).expand(b, t).contiguous()
        shapes = ({n: None for n in weights}, {0: batch, 1: tokens}, {0: batch, 1: _dim("logits", limits.max_tokens)})
        return HeadGraph(head), (weights, hidden, index), shapes
    kind, _, group = name.partition(".")
    index = layer_groups(lm).index(int(group or 0))
    weights = layer_weights(lm, index)
    if kind == LAYER_DECODE:
        t, tokens = 1, torch.export.Dim.STATIC
    x = torch.zeros(b, t, cfg.hidden_size, dtype=dtype)
    rope = torch.zeros(b, t, cfg.head_dim, dtype=dtype)
    windowed = cfg.window(cfg.layer_kind(index)) is not None  # each token its own past mask [b, 1, T, L]
    positions = limits.ring if windowed and limits.ring else limits.max_seq  # the cache row: a ring, or every one
    n_past = _example_size(positions)
    past = torch.ones(b, 1, t if windowed else 1, n_past, dtype=torch.bool)
    rows = torch.zeros(b, cfg.num_kv_heads, cache_positions(positions), cfg.head_dim, dtype=dtype)
    row = {0: batch}
    args = (weights, x, rope, rope.clone(), past, rows, rows.clone())
    past_dims = {0: batch, 3: _dim("attend_len", positions)} | ({2: tokens} if windowed else {})
    shapes = ({n: None for n in weights}, {0: batch, 1: tokens}, {0: batch, 1: tokens}, {0: batch, 1: tokens},
              past_dims, row, row)
    if lm.lora_layout is not None:  # the per-row adapter mask
        args += (torch.zeros(b, 1, lm.lora_layout.width, dtype=dtype),)
        return LoraLayerGraph(meta.model.layers[index]), args, (*shapes, row)
    return LayerGraph(meta.model.layers[index]), args, shapes


def export_graph(lm: CausalLM, name: str, limits: GraphLimits, kernels: bool = False):
    """torch.export graph ``name`` (see ``graph_names``) with its dynamic dimensions; weights are inputs (the
    linears call neuronpack's kernels when ``kernels``)."""
    module, args, shapes = _graph_and_inputs(lm, name, limits, kernels)
    with torch.no_grad():
        return torch.export.export(module, args, strict=False, dynamic_shapes=shapes)


def new_kv_cache(lm: CausalLM, batch_size: int, max_seq: int, dtype: torch.dtype, device="cpu"):
    """Stacked K and V caches, each ``[layers, batch_size, kv_heads, cache_positions(max_seq), head_dim]`` zeros
    (layer l's cache is the contiguous ``cache[l]``)."""
    cfg = lm.config
    shape = (cfg.num_layers, batch_size, cfg.num_kv_heads, cache_positions(max_seq), cfg.head_dim)
    return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)


def _int8_prefixes(lm: CausalLM) -> frozenset[str]:
    from neuronpack.models.quant import Int8Linear

    return frozenset(name for name, mod in lm.named_modules() if isinstance(mod, Int8Linear))
