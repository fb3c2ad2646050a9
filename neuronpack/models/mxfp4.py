"""MXFP4 (OCP microscaling FP4), the format gpt-oss's experts ship in, kept compact: 4.25 bits per weight.

A row of K weights is K / 32 blocks; a block is 16 bytes of FP4 E2M1 codes (element 2i in the low nibble of byte i,
2i + 1 in the high one) and one E8M0 scale byte (2^(s - 127); 255 is NaN). gpt-oss's released checkpoints store an
expert projection as ``<name>_blocks`` uint8 [E, rows, K / 32, 16] and ``<name>_scales`` uint8 [E, rows, K / 32],
rows being the output features (transformers' ``integrations/mxfp4.py`` reads the same). The routed-experts kernel
(kernels/moe.cpp) dequantizes them in registers; ``dequantize`` is the same arithmetic in torch ops (the reference,
export-only graphs, tests), written without constant tensors so it exports as plain arithmetic.

Example::

    w = dequantize(blocks, scales, torch.float32)    # [E, rows, K / 32, 16], [E, rows, K / 32] -> [E, rows, K]
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 32  # weights per scale
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def fp4_values(codes: Tensor) -> Tensor:
    """FP4 E2M1 codes (integers 0..15) -> float32 values: sign bit 3, exponent bits 2-1, mantissa bit 0."""
    c = codes.to(torch.int32)
    magnitude = c & 7
    exponent = magnitude >> 1
    normal = (2 + (magnitude & 1)).float() * torch.exp2((exponent - 2).float())  # 1, 1.5, 2, 3, 4, 6
    value = torch.where(exponent == 0, magnitude.float() * 0.5, normal)  # 0 and the subnormal 0.5
    return torch.where((c & 8) != 0, -value, value)


def e8m0_values(scales: Tensor) -> Tensor:
    """E8M0 scale bytes -> float32 2^(s - 127) exactly (the float32 exponent field, or the subnormal 2^-127 for 0;
    NaN for 255)."""
    s = scales.to(torch.int32)
    value = (s << 23).view(torch.float32)
    value = torch.where(s == 0, torch.full_like(value, 2.0 ** -127), value)
    return torch.where(s == 255, torch.full_like(value, float("nan")), value)


def dequantize(blocks: Tensor, scales: Tensor, dtype: torch.dtype) -> Tensor:
    """blocks uint8 [..., K / 32, 16] (or [..., K / 2]) and scales uint8 [..., K / 32] -> ``dtype`` [..., K]."""
    lead = scales.shape
    blocks = blocks.reshape(*lead, BLOCK // 2)
    pairs = torch.stack((fp4_values(blocks & 15), fp4_values(blocks >> 4)), dim=-1)  # [..., K / 32, 16, 2]
    values = pairs.reshape(*lead, BLOCK) * e8m0_values(scales)[..., None]
    return values.reshape(*lead[:-1], lead[-1] * BLOCK).to(dtype)


def quantize(weight: Tensor, *, chunk_rows: int = 4096) -> tuple[Tensor, Tensor]:
    """float [..., K] -> (blocks uint8 [..., K / 32, 16], scales uint8 [..., K / 32]): each block's scale the
    smallest power of two that brings its largest magnitude within 6, each value rounded to the nearest FP4 value
    (ties to the smaller magnitude), ``chunk_rows`` rows at a time (a few bytes of temporaries per weight). For tests
    and benchmarks that need MXFP4 weights written as gpt-oss ships them."""
    *lead, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"MXFP4 rows must be a multiple of {BLOCK} long, not {k}")
    rows = weight.reshape(-1, k)
    blocks = torch.empty(rows.shape[0], k // 2, dtype=torch.uint8)
    scales = torch.empty(rows.shape[0], k // BLOCK, dtype=torch.uint8)
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # between the 8 magnitudes
    for r in range(0, rows.shape[0], chunk_rows):
        w = rows[r:r + chunk_rows].float().reshape(-1, k // BLOCK, BLOCK)
        top = w.abs().amax(-1).clamp_min(2.0 ** -126)
        s = (torch.ceil(torch.log2(top / 6.0)).clamp(-127, 127) + 127).to(torch.uint8)
        scaled = w / e8m0_values(s)[..., None]
        codes = torch.bucketize(scaled.abs(), midpoints).to(torch.uint8) | ((scaled < 0).to(torch.uint8) << 3)
        blocks[r:r + chunk_rows] = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(-1, k // 2)
        scales[r:r + chunk_rows] = s
    return blocks.reshape(*lead, k // BLOCK, BLOCK // 2), scales.reshape(*lead, k // BLOCK)
