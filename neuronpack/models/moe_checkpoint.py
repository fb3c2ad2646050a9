"""A mixture-of-experts block's experts read from a checkpoint, whatever layout it ships in, into the stacked tensors
the routed-experts kernel takes (kernels/moe.cpp), by their names under the block's ``experts`` (models/moe.py):
``gate_up.weight`` [E, 2I, H] (the gate rows, then the up rows), ``down.weight`` [E, H, I], and where the checkpoint
has them ``gate_up.scale`` / ``down.scale`` and ``gate_up.bias`` / ``down.bias`` [E, rows] (float32).

Layouts, recognised from the tensor names under the block's prefix:

- neuronpack's own (an artifact's weights): the names above, as they are;
- per expert (what transformers writes for Qwen3-MoE and Mixtral, and their released checkpoints):
  ``experts.<e>.<gate>.weight`` [I, H], ``<up>`` [I, H], ``<down>`` [H, I] (Mixtral's w1 / w3 / w2); int8 ones as
  ``neuronpack quantize`` writes them, with NxD Inference's ``.scale`` [rows, 1] beside each;
- fused (transformers' in-memory layout, written with ``save_original_format=False``): ``experts.gate_up_proj``
  [E, 2I, H] and ``experts.down_proj`` [E, H, I]; gpt-oss's as transformers writes it is transposed (``x @ W``:
  [E, H, 2I], [E, I, H]) with gate and up interleaved (columns 2j and 2j + 1), biases alike;
- MXFP4 (gpt-oss's released layout): ``experts.gate_up_proj_blocks`` uint8 [E, 2I, H / 32, 16] with
  ``experts.gate_up_proj_scales`` uint8 [E, 2I, H / 32] (rows interleaved as above), ``down_proj_blocks`` /
  ``down_proj_scales`` likewise: kept as they are (models/mxfp4.py), 4.25 bits per weight, never widened.

Float tensors are cast to the compute dtype; int8 and MXFP4 stay compact.

Example::

    tensors = read_experts(ckpt, ["model.layers.0.mlp"], ExpertNames(), torch.float32)
    tensors["gate_up.weight"].shape       # [E, 2I, H]
    expert_format(ckpt, ["model.layers.0.mlp"], ExpertNames())   # "float", "int8" or "mxfp4"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from neuronpack.errors import CheckpointError
from neuronpack.models.moe_config import ExpertNames

if TYPE_CHECKING:
    from neuronpack.checkpoint import Checkpoint


OWN, MXFP4, FUSED, PER_EXPERT = "own", "mxfp4", "fused", "per_expert"


def read_experts(ckpt: Checkpoint, prefixes: Sequence[str], names: ExpertNames, dtype: torch.dtype
                 ) -> dict[str, Tensor]:
    """The experts of the first of ``prefixes`` (the block's module, e.g. ``model.layers.3.mlp``) the checkpoint
    has, in the kernel's layout (see the module docstring), by their names under the block's ``experts``."""
    present = set(ckpt.names())
    layout, base = _layout(ckpt, prefixes, names, present)
    if layout == OWN:
        return {name[len(base) + 1:]: _own(ckpt.get(name), dtype) for name in sorted(present)
                if name.startswith(f"{base}.gate_up.") or name.startswith(f"{base}.down.")}
    read = {MXFP4: _mxfp4, FUSED: _fused, PER_EXPERT: _per_expert}[layout]
    return read(ckpt, base, names, present, dtype)


def expert_format(ckpt: Checkpoint, prefixes: Sequence[str], names: ExpertNames) -> str:
    """How the checkpoint holds the first of ``prefixes``' experts: "float", "int8" (per channel, with scales) or
    "mxfp4", from the tensors' names and dtypes alone."""
    present = set(ckpt.names())
    layout, base = _layout(ckpt, prefixes, names, present)
    if layout == MXFP4:
        return "mxfp4"
    first = {OWN: f"{base}.gate_up.weight", FUSED: f"{base}.gate_up_proj",
             PER_EXPERT: f"{base}.0.{names.gate}.weight"}[layout]
    return {"I8": "int8", "U8": "mxfp4"}.get(ckpt.info(first).dtype, "float")


def _layout(ckpt: Checkpoint, prefixes: Sequence[str], names: ExpertNames, present: set[str]) -> tuple[str, str]:
    for prefix in prefixes:
        base = f"{prefix}.experts"
        for layout, name in ((OWN, f"{base}.gate_up.weight"), (MXFP4, f"{base}.gate_up_proj_blocks"),
                             (FUSED, f"{base}.gate_up_proj"), (PER_EXPERT, f"{base}.0.{names.gate}.weight")):
            if name in present:
                return layout, base
    raise CheckpointError(f"checkpoint has no experts under {' or '.join(prefixes)}", where=str(ckpt.root),
                          fix="check that config.json belongs to these weights")


def _own(t: Tensor, dtype: torch.dtype) -> Tensor:
    """Weights of a float dtype in ``dtype``; int8 / MXFP4 bytes, scales and biases as stored."""
    return t.to(dtype) if t.dtype in (torch.float32, torch.bfloat16, torch.float16) and t.dim() == 3 else t


def halves(t: Tensor, dim: int) -> Tensor:
    """Interleaved gate / up (gate at even indices of ``dim``) -> gate half then up half, a copy."""
    pairs = t.unflatten(dim, (-1, 2))
    return torch.cat((pairs.select(dim + 1, 0), pairs.select(dim + 1, 1)), dim=dim).contiguous()


def _fused(ckpt: Checkpoint, base: str, names: ExpertNames, present: set[str], dtype: torch.dtype
           ) -> dict[str, Tensor]:
    gate_up, down = ckpt.get(f"{base}.gate_up_proj"), ckpt.get(f"{base}.down_proj")
    if names.transposed:  # x @ W: [E, H, 2I], [E, I, H] -> [E, 2I, H], [E, H, I]
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    if names.interleaved:
        gate_up = halves(gate_up, 1)
    out = {"gate_up.weight": gate_up.to(dtype).contiguous(), "down.weight": down.to(dtype).contiguous()}
    return out | _biases(ckpt, base, names, present)


def _mxfp4(ckpt: Checkpoint, base: str, names: ExpertNames, present: set[str], dtype: torch.dtype
           ) -> dict[str, Tensor]:
    out = {}
    for proj, ours in (("gate_up_proj", "gate_up"), ("down_proj", "down")):
        blocks, scales = ckpt.get(f"{base}.{proj}_blocks"), ckpt.get(f"{base}.{proj}_scales")
        if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
            raise CheckpointError(f"{base}.{proj}_blocks / _scales are not MXFP4 (uint8 [E, rows, K / 32, 16] and "
                                  f"[E, rows, K / 32]): {tuple(blocks.shape)} {blocks.dtype}, {tuple(scales.shape)} "
                                  f"{scales.dtype}", where=str(ckpt.root), fix="check the checkpoint")
        if proj == "gate_up_proj" and names.interleaved:  # rows alternate gate / up
            blocks, scales = halves(blocks, 1), halves(scales, 1)
        out[f"{ours}.weight"], out[f"{ours}.scale"] = blocks.contiguous(), scales.contiguous()
    return out | _biases(ckpt, base, names, present)


def _biases(ckpt: Checkpoint, base: str, names: ExpertNames, present: set[str]) -> dict[str, Tensor]:
    out = {}
    for proj, ours in (("gate_up_proj", "gate_up"), ("down_proj", "down")):
        if f"{base}.{proj}_bias" in present:
            bias = ckpt.get(f"{base}.{proj}_bias").float()
            out[f"{ours}.bias"] = halves(bias, 1) if proj == "gate_up_proj" and names.interleaved else bias
    return out


def _per_expert(ckpt: Checkpoint, base: str, names: ExpertNames, present: set[str], dtype: torch.dtype
                ) -> dict[str, Tensor]:
    count = 0
    while f"{base}.{count}.{names.gate}.weight" in present:
        count += 1
    gate_up = _stacked(ckpt, [[f"{base}.{e}.{names.gate}", f"{base}.{e}.{names.up}"] for e in range(count)],
                       present, dtype)
    down = _stacked(ckpt, [[f"{base}.{e}.{names.down}"] for e in range(count)], present, dtype)
    out = {}
    for key, (weight, scale, bias) in (("gate_up", gate_up), ("down", down)):
        out[f"{key}.weight"] = weight
        if scale is not None:
            out[f"{key}.scale"] = scale
        if bias is not None:
            out[f"{key}.bias"] = bias
    return out


def _stacked(ckpt: Checkpoint, linears: list[list[str]], present: set[str], dtype: torch.dtype
             ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Per expert, the linears' weights one after another along the rows: (weights [E, rows, K] in ``dtype``, or
    int8 with float32 scales [E, rows]; biases float32 [E, rows] or None)."""
    first = ckpt.get(f"{linears[0][0]}.weight")
    quantized = first.dtype == torch.int8 and f"{linears[0][0]}.scale" in present
    rows = sum(ckpt.info(f"{p}.weight").shape[0] for p in linears[0])
    weight = torch.empty(len(linears), rows, first.shape[1], dtype=torch.int8 if quantized else dtype)
    scale = torch.empty(len(linears), rows) if quantized else None
    bias = torch.zeros(len(linears), rows) if f"{linears[0][0]}.bias" in present else None
    for e, prefixes in enumerate(linears):
        row = 0
        for prefix in prefixes:
            w = ckpt.get(f"{prefix}.weight")
            if quantized != (w.dtype == torch.int8):
                raise CheckpointError(f"{prefix}.weight is {w.dtype}, its block's first expert {first.dtype}",
                                      where=str(ckpt.root), fix="quantize every expert of a block alike")
            weight[e, row:row + w.shape[0]] = w if quantized else w.to(dtype)
            if scale is not None:  # per-channel [rows, 1] or per-tensor [1]
                scale[e, row:row + w.shape[0]] = ckpt.get(f"{prefix}.scale").float().reshape(-1)
            if bias is not None:
                bias[e, row:row + w.shape[0]] = ckpt.get(f"{prefix}.bias").float()
            row += w.shape[0]
    return weight, scale, bias
