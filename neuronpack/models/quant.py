"""Weight-only quantized linears in NxD Inference's checkpoint format.

A quantized linear is stored as ``<prefix>.weight`` (int8 or float8_e4m3fn, [out, in]) plus ``<prefix>.scale``
(float32, [out, 1] per-channel or [1] per-tensor), symmetric: ``w ≈ weight * scale``.

- int8 stays int8 in memory and runs through ``torch._weight_int8pack_mm`` (exports and compiles with AOTInductor).
- fp8: CPU PyTorch has no weight-only fp8 matmul (``_scaled_mm`` would also quantize activations), so fp8 weights
  are dequantized to the compute dtype at load time (``dequantize_fp8``) and the caller warns.

Example::

    layer = Int8Linear(64, 32)
    layer.load_state_dict({"weight": w_int8, "scale": scale_32x1}, assign=True)
    y = layer(x)            # x [..., 64] float32/bfloat16 -> [..., 32]
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

QUANTIZED_DTYPES = (torch.int8, torch.float8_e4m3fn)


class Int8Linear(nn.Module):
    """y = x @ (weight * scale).T + bias with int8 ``weight`` [out, in] and float32 ``scale`` [out, 1] or [1]."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.empty(out_features, 1, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        # The kernel wants per-output-channel scales [out] in the activation dtype (load_model expands a
        # per-tensor [1] scale to [out, 1]).
        scales = self.scale.reshape(-1).expand(self.out_features).to(x.dtype)
        y = torch._weight_int8pack_mm(x.reshape(-1, self.in_features), self.weight, scales)  # [M, out]
        y = y.view(*lead, self.out_features)
        return y + self.bias if self.bias is not None else y


def dequantize_fp8(weight: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """float8_e4m3fn [out, in] * scale ([out, 1] or [1]) -> ``dtype`` [out, in]."""
    return (weight.float() * scale.float()).to(dtype)


def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in QUANTIZED_DTYPES
