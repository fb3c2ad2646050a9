"""Symmetric weight quantization math (int8 and fp8 e4m3), on row chunks so large matrices never need a full copy.

A quantized linear stores ``q = quantize(w / scale)`` and ``scale`` (float32). Symmetric: no zero point, and
``deq = q * scale``. int8: ``scale = amax / 127``, ``q = round(w / scale)``. fp8 e4m3: ``scale = amax / 240``
(Neuron's bound, not the format's 448), ``q = fp8(clamp(w / scale, -240, 240))``. Per-channel: one amax per output
row (scale shape ``[out_features, 1]``); per-tensor: one amax for the whole matrix (scale shape ``[1]``).

Every full-size pass over a chunk costs about the same (memory bound), so ``quantize_rows`` makes one float32 copy
and derives the scale, the quantized values and the error statistics from it (about 9 passes per chunk).

Example::

    w = torch.randn(8, 16)
    q, scale = quantize_rows(w, "int8")          # [8, 16] int8, [8, 1] float32 (per-channel)
    err = (w - dequantize(q, scale)).abs()       # <= scale / 2 element-wise
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Largest representable magnitude of each quantized dtype as Neuron uses it.
QMAX = {"int8": 127.0, "fp8": 240.0}
TORCH_DTYPE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
# e4m3: 3 mantissa bits, so round-to-nearest is off by at most 2**-4 of the value for normal numbers; below the
# smallest normal (2**-6) the spacing is a constant 2**-9, so the absolute error is at most 2**-10.
FP8_REL_BOUND = 2.0**-4
FP8_SUBNORMAL_ABS_BOUND = 2.0**-10


def scale_from_amax(amax: torch.Tensor, dtype: str) -> torch.Tensor:
    """float32 scale ``amax / qmax``; an all-zero row gets scale 1 so it quantizes to zeros instead of NaN.

    Example::

        scale_from_amax(torch.tensor([254.0, 0.0]), "int8")   # tensor([2., 1.])
    """
    amax = amax.to(torch.float32)
    return torch.where(amax > 0, amax / QMAX[dtype], torch.ones_like(amax))


def channel_scales(rows: torch.Tensor, dtype: str) -> torch.Tensor:
    """Per-output-channel scales of a row chunk: ``rows`` [R, C] -> [R, 1] float32."""
    amax = torch.linalg.vector_norm(rows.detach(), ord=math.inf, dim=1, keepdim=True)  # [R, 1] = max |w| per row
    return scale_from_amax(amax, dtype)


def chunk_amax(rows: torch.Tensor) -> float:
    """Largest magnitude of a row chunk (used by the first pass of per-tensor quantization)."""
    if rows.numel() == 0:
        return 0.0
    return float(torch.linalg.vector_norm(rows.detach(), ord=math.inf).to(torch.float32))


def first_nonfinite(rows: torch.Tensor) -> tuple[tuple[int, ...], float] | None:
    """Index and value of the first NaN or infinity of ``rows`` in row-major order, or None when all are finite.

    Example::

        first_nonfinite(torch.tensor([[1.0, float("nan")]]))   # ((0, 1), nan)
    """
    bad = ~torch.isfinite(rows)
    if not bool(bad.any()):
        return None
    flat = int(bad.reshape(-1).nonzero()[0, 0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), rows.shape))
    return index, float(rows.reshape(-1)[flat])


def quantize_rows(
    rows: torch.Tensor, dtype: str, scale: torch.Tensor | None = None, *, stats: ErrorAccumulator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a row chunk ``rows`` [R, C]; return ``(q, scale)`` with q int8 / float8_e4m3fn [R, C].

    ``scale`` None means per-channel (computed here, [R, 1]); pass the tensor's [1] scale for per-tensor. With
    ``stats``, the chunk's reconstruction error is accumulated too, reusing the float32 copy of the rows.

    Example::

        q, scale = quantize_rows(torch.tensor([[1.0, -2.0]]), "int8")    # [[64, -127]], [[2 / 127]]
    """
    qmax = QMAX[dtype]
    w = rows.detach().to(torch.float32)  # [R, C]; aliases rows when already float32, so w is never modified
    if scale is None:
        scale = channel_scales(w, dtype)
    scaled = w / scale  # [R, C] in units of scale
    if dtype == "int8":
        levels = scaled.round().clamp_(-qmax, qmax)
    else:
        levels = scaled.clamp(-qmax, qmax)
    q = levels.to(TORCH_DTYPE[dtype])
    if stats is not None:
        if dtype == "fp8":
            levels = q.to(torch.float32)  # the values fp8 can actually hold
        stats.add(w, scaled.sub_(levels), scale)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` in float32: what a runtime multiplies with. ``q`` [R, C], ``scale`` [R, 1] or [1]."""
    return q.to(torch.float32).mul_(scale)


def error_bound(rows: torch.Tensor, scale: torch.Tensor, dtype: str) -> torch.Tensor:
    """Element-wise worst-case |w - deq(q)| of the scheme (plus float32 round-off), shape of ``rows``.

    int8 rounds to the nearest step of ``scale``: at most ``scale / 2``. fp8 e4m3 has 3 mantissa bits: at most
    ``|w| / 16`` for normal values, ``scale * 2**-10`` in the subnormal range.
    """
    w = rows.to(torch.float32).abs()
    fp32_slack = w * 2.0**-20 + scale * 2.0**-20
    if dtype == "int8":
        return scale / 2 + fp32_slack
    return torch.maximum(w * FP8_REL_BOUND, scale * FP8_SUBNORMAL_ABS_BOUND) + fp32_slack


@dataclass
class ErrorAccumulator:
    """Running sums over the chunks of one tensor (or a whole model) to get ||W - deq(Q)|| / ||W|| and SNR.

    Example::

        acc = ErrorAccumulator()
        quantize_rows(w, "int8", stats=acc)
        acc.relative_error, acc.snr_db
    """

    signal: float = 0.0  # sum of w**2
    noise: float = 0.0  # sum of (w - deq)**2

    def add(self, rows: torch.Tensor, scaled_error: torch.Tensor, scale: torch.Tensor) -> None:
        """Add a chunk: ``rows`` [R, C], its error in units of ``scale`` ([R, C]) and ``scale`` ([R, 1] or [1])."""
        # Per-row float32 norms (one fused pass each), squared and summed in float64 so hundreds of millions of
        # elements keep their digits; cheaper than squaring the whole chunk in float64.
        noise_rows = _row_norms(scaled_error) * scale.reshape(-1)  # [R]: ||w_r - deq_r||
        self.signal += float(_row_norms(rows.to(torch.float32)).double().square().sum())
        self.noise += float(noise_rows.double().square().sum())

    def merge(self, other: ErrorAccumulator) -> None:
        self.signal += other.signal
        self.noise += other.noise

    @property
    def relative_error(self) -> float:
        return math.sqrt(self.noise / self.signal) if self.signal > 0 else 0.0

    @property
    def snr_db(self) -> float | None:
        """10 log10(signal / noise); None when the quantization was exact (infinite SNR)."""
        if self.noise <= 0:
            return None
        if self.signal <= 0:
            return 0.0
        return 10.0 * math.log10(self.signal / self.noise)


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dim=1)  # [R]
