"""Per-row LoRA for the portable model: several adapters resident at once, one adapter slot per sequence.

Every targeted linear gets two extra buffers, every resident adapter's weights side by side, ranks zero-padded to
``max_rank`` and PEFT's scaling folded into B::

    lora_A  [max_loras * max_rank, in]     rows s*R .. s*R+r-1: adapter slot s+1's A
    lora_B  [out, max_loras * max_rank]    columns s*R .. s*R+r-1: adapter slot s+1's B * scaling

A batch passes one adapter slot per row (0 = no adapter, the base model; 1..max_loras the resident adapters); the
forward turns it into a mask ``[B, 1, max_loras * max_rank]`` once, and each targeted linear adds
``((x @ lora_A.T) * mask) @ lora_B.T``: two small dense matmuls and no gather, so AOTInductor compiles it like any
other linear and rows with different adapters (or none) share one step. Zero padding and the mask keep every other
adapter's columns out of a row's result exactly (their products are multiplied by 0, not approximated).

Example::

    layout = LoraLayout(max_loras=2, max_rank=16, target_modules=("q_proj", "v_proj"))
    attach_lora(model, layout)                      # zero stacks: every slot is the base model
    fill_lora(model, layout, [info_sql, info_chat])  # slots 1 and 2 (AdapterInfo from checkpoint.lora)
    mask = lora_mask(torch.tensor([0, 2, 1]), layout, torch.float32)   # three rows: base, chat, sql
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from neuronpack.checkpoint.lora import LINEAR_BLOCKS, AdapterInfo, adapter_tensors
from neuronpack.errors import CheckpointError
from neuronpack.models.config import ModelConfig


@dataclass(frozen=True)
class LoraLayout:
    """What the graphs are compiled for: ``max_loras`` resident adapters of rank <= ``max_rank`` on
    ``target_modules`` of every layer."""

    max_loras: int
    max_rank: int
    target_modules: tuple[str, ...]

    @property
    def width(self) -> int:
        return self.max_loras * self.max_rank

    def to_dict(self) -> dict:
        return {"max_loras": self.max_loras, "max_rank": self.max_rank, "target_modules": list(self.target_modules)}

    @classmethod
    def from_dict(cls, data: dict) -> LoraLayout:
        return cls(int(data["max_loras"]), int(data["max_rank"]), tuple(data["target_modules"]))


def linear_shape(cfg: ModelConfig, module: str) -> tuple[int, int]:
    """(in_features, out_features) of a layer's linear ``module``."""
    h, i, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}[module]


def lora_linears(model: nn.Module, layout: LoraLayout) -> Iterator[tuple[int, str, nn.Module]]:
    """(layer index, module name, linear) of every targeted linear."""
    for index, layer in enumerate(model.model.layers):
        for module in layout.target_modules:
            yield index, module, getattr(getattr(layer, LINEAR_BLOCKS[module]), module)


def attach_lora(model: nn.Module, layout: LoraLayout, device: str | torch.device | None = None) -> None:
    """Give every targeted linear zero ``lora_A`` / ``lora_B`` buffers (tensors named
    ``model.layers.N.<block>.<module>.lora_A``) in the model's dtype: all slots are the base model until filled."""
    dtype = model.model.embed_tokens.weight.dtype
    device = device if device is not None else model.model.embed_tokens.weight.device
    model.lora_layout = layout
    for _index, module, linear in lora_linears(model, layout):
        fan_in, fan_out = linear_shape(model.config, module)
        # not persistent: the artifact stores the PEFT adapters, not these stacks (like rope_inv_freq, they are
        # tensors the layer graphs read, built at load)
        linear.register_buffer("lora_A", torch.zeros(layout.width, fan_in, dtype=dtype, device=device),
                               persistent=False)
        linear.register_buffer("lora_B", torch.zeros(fan_out, layout.width, dtype=dtype, device=device),
                               persistent=False)


def fill_lora(model: nn.Module, layout: LoraLayout, adapters: Sequence[AdapterInfo]) -> None:
    """Write ``adapters[k]`` into slot k+1 (its rank padded with zeros, B scaled by PEFT's scaling); other slots
    stay zero. CheckpointError when an adapter's matrices do not fit the model."""
    if len(adapters) > layout.max_loras:
        raise CheckpointError(f"{len(adapters)} adapters for {layout.max_loras} slots", where="lora.max_loras",
                              fix=f"set lora.max_loras to at least {len(adapters)}")
    linears = {(index, module): linear for index, module, linear in lora_linears(model, layout)}
    with torch.no_grad():
        for linear in linears.values():
            linear.lora_A.zero_()
            linear.lora_B.zero_()
        for slot, info in enumerate(adapters):
            cols = slice(slot * layout.max_rank, slot * layout.max_rank + info.rank)
            for (index, module), (a, b) in adapter_tensors(info).items():
                linear = linears.get((index, module))
                _check_fits(info, index, module, linear, a, b)
                linear.lora_A[cols] = a.to(linear.lora_A.dtype)
                linear.lora_B[:, cols] = (b.float() * info.scaling).to(linear.lora_B.dtype)


def _check_fits(info: AdapterInfo, index: int, module: str, linear: nn.Module | None, a: Tensor, b: Tensor) -> None:
    if linear is None:
        what = f"adapts layer {index} {module}, which this model does not have"
    elif a.shape[1] != linear.lora_A.shape[1] or b.shape[0] != linear.lora_B.shape[0]:
        what = f"layer {index} {module}: lora_A {list(a.shape)} / lora_B {list(b.shape)} do not fit this model"
    else:
        return
    raise CheckpointError(what, where=f"lora adapter {info.name!r}: {info.path}",
                          fix="use an adapter trained on this base model")


def lora_mask(rows: Tensor, layout: LoraLayout, dtype: torch.dtype) -> Tensor:
    """rows [B] int64 adapter slots (0 = none) -> [B, 1, max_loras * max_rank] in ``dtype``: 1 on the columns of
    the row's adapter, 0 elsewhere."""
    column_slot = torch.arange(layout.width, device=rows.device) // layout.max_rank + 1  # [W]
    return (column_slot[None, :] == rows[:, None]).to(dtype)[:, None, :]


def project(linear: nn.Module, x: Tensor, mask: Tensor | None) -> Tensor:
    """``linear(x)`` plus each row's adapter: x [B, T, in], mask [B, 1, W] from ``lora_mask`` (None: no LoRA)."""
    y = linear(x)
    if mask is None or not hasattr(linear, "lora_A"):
        return y
    return y + F.linear(F.linear(x, linear.lora_A) * mask, linear.lora_B)
