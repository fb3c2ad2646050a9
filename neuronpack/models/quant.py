"""Weight-only quantized linears in NxD Inference's checkpoint format.

A quantized linear is stored as ``<prefix>.weight`` (int8 or float8_e4m3fn, [out, in]) plus ``<prefix>.scale``
(float32, [out, 1] per-channel or [1] per-tensor), symmetric: ``w ≈ weight * scale``.

- int8 stays int8 in memory. With ``kernel`` set (models/linear_kernels.py; what a portable artifact's graphs run)
  the matmul is neuronpack's kernel ``torch.ops.neuronpack.linear_int8``: up to 16 rows convert each int8 weight in
  registers as they read it once, more rows dequantize and run a regular matmul. Without it (a reference, or an
  export-only program), the matmul is written so that AOTInductor compiles it well: few rows (decode) run as a
  float32 reduction ``sum(x[:, None, :] * weight, -1) * scale`` that inductor fuses into one pass over the int8
  bytes; many rows (context encoding) dequantize the weight to the activation dtype and use a regular matmul.
  ``torch._weight_int8pack_mm`` is not used: its CPU kernel is slower
  than float32 for float32 activations, and AOTInductor fails to lower it (``LoweringException``) when its scale
  is cast to bfloat16 inside the graph.
- fp8: CPU PyTorch has no weight-only fp8 matmul (``_scaled_mm`` would also quantize activations), so fp8 weights
  are dequantized to the compute dtype at load time (``dequantize_fp8``) and the caller warns.

Example::

    layer = Int8Linear(64, 32)
    layer.load_state_dict({"weight": w_int8, "scale": scale_32x1}, assign=True)
    y = layer(x)            # x [..., 64] float32/bfloat16 -> [..., 32]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Up to this many rows (tokens x batch) the reduction form beats dequantize + matmul once compiled
# (1 thread, SmolLM2 layer shapes: float32 8 rows 9.0 vs 19.5 ms, bfloat16 4 rows 6.2 vs 6.0 ms, 8 rows 11.7 vs 6.8).
GEMV_MAX_ROWS = {torch.float32: 8}
GEMV_MAX_ROWS_DEFAULT = 4


class Int8Linear(nn.Module):
    """y = x @ (weight * scale).T + bias with int8 ``weight`` [out, in] and float32 ``scale`` [out, 1] or [1]."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.empty(out_features, 1, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.kernel = False

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel:
            return torch.ops.neuronpack.linear_int8(x, self.weight, self.scale, self.bias)
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)  # [M, in]; M may be symbolic (dynamic shapes): decided statically
        if _few_rows(rows.shape[0], GEMV_MAX_ROWS.get(x.dtype, GEMV_MAX_ROWS_DEFAULT)):
            y = int8_gemv(rows, self.weight)  # [M, out] float32
        else:
            # int8 values are exact in bfloat16/float16/float32: only the matmul's accumulation rounds.
            y = F.linear(rows, self.weight.to(x.dtype)).float()  # [M, out]
        # Scale in float32 (load_model expands a per-tensor [1] scale to [out, 1]), then back to the compute dtype.
        y = (y * self.scale.reshape(1, -1).float()).to(x.dtype).view(*lead, self.out_features)
        return y + self.bias if self.bias is not None else y


def _few_rows(m, limit: int) -> bool:
    """``m <= limit`` for a plain or a symbolic size (a dynamic batch): True only when provable for every value,
    so a graph whose row count may exceed ``limit`` takes the matmul form."""
    if isinstance(m, int):
        return m <= limit
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(m <= limit)


def int8_gemv(rows: Tensor, weight: Tensor) -> Tensor:
    """rows [M, in] (any float dtype) @ int8 weight [out, in].T -> float32 [M, out], unscaled.

    Written as a broadcast multiply + sum so inductor emits one vectorised loop that converts each int8 weight
    on the fly (no dequantized copy). Eager mode materialises [M, out, in]: fine for references, slow to run.

    Example: ``int8_gemv(torch.ones(1, 2), torch.tensor([[1, 2]], dtype=torch.int8))  # tensor([[3.]])``
    """
    return (rows.float().unsqueeze(1) * weight.float()).sum(-1)  # [M, 1, in] * [out, in] -> sum -> [M, out]


def dequantize_fp8(weight: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """float8_e4m3fn [out, in] * scale ([out, 1] or [1]) -> ``dtype`` [out, in]."""
    return (weight.float() * scale.float()).to(dtype)
