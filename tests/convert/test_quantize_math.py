"""The quantization math against its theoretical bounds: int8 rounding error <= scale/2, fp8 e4m3 <= 1/16 relative."""

from __future__ import annotations

import math

import pytest
import torch

from neuronpack.convert.quant_math import (
    ErrorAccumulator,
    channel_scales,
    chunk_amax,
    dequantize,
    error_bound,
    quantize_rows,
    scale_from_amax,
)


def _weights(dtype=torch.float32) -> torch.Tensor:
    torch.manual_seed(0)
    w = torch.randn(48, 96) * torch.logspace(-3, 1, 48).unsqueeze(1)  # rows spanning 4 orders of magnitude
    w[5] = 0.0  # an all-zero row must not produce NaN scales
    w[7, 3] = 40.0  # an outlier
    return w.to(dtype)


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
@pytest.mark.parametrize("source_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_per_channel_error_within_theoretical_bound(dtype, source_dtype):
    w = _weights(source_dtype)
    scale = channel_scales(w, dtype)
    assert scale.shape == (48, 1) and scale.dtype == torch.float32
    q = quantize_rows(w, scale, dtype)
    assert q.dtype == (torch.int8 if dtype == "int8" else torch.float8_e4m3fn)
    deq = dequantize(q, scale)
    err = (w.float() - deq).abs()
    assert torch.all(err <= error_bound(w, scale, dtype))
    assert torch.all(deq[5] == 0) and torch.isfinite(deq).all()
    qmax = 127 if dtype == "int8" else 240
    # Symmetric: each non-zero row uses its full range exactly once at its largest magnitude.
    row_max = q.float().abs().amax(dim=1)
    assert torch.all(row_max[w.float().abs().amax(dim=1) > 0] == qmax)


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_per_tensor_uses_one_scale_and_clamps(dtype):
    w = _weights()
    amax = max(chunk_amax(w[:20]), chunk_amax(w[20:]))  # two row chunks, as the streaming pass does
    assert amax == pytest.approx(40.0)
    scale = scale_from_amax(torch.tensor([amax]), dtype)
    assert scale.shape == (1,)
    assert scale.item() == pytest.approx(40.0 / (127 if dtype == "int8" else 240))
    q = quantize_rows(w, scale, dtype)
    assert q.float().abs().max().item() == (127 if dtype == "int8" else 240)
    err = (w - dequantize(q, scale)).abs()
    assert torch.all(err <= error_bound(w, scale, dtype))


def test_int8_rounds_to_nearest_step():
    scale = torch.tensor([[2.0 / 127]])
    q = quantize_rows(torch.tensor([[1.0, -2.0, 0.0, 2.0 / 127 * 10.4]]), scale, "int8")
    assert q.tolist() == [[64, -127, 0, 10]]


def test_fp8_never_exceeds_neuron_bound_of_240():
    # Values beyond amax (cannot happen with our scales, but a caller could pass a smaller scale) clamp to 240.
    q = quantize_rows(torch.tensor([[1000.0, -1000.0, 1.0]]), torch.tensor([1.0]), "fp8")
    assert q.float().tolist() == [[240.0, -240.0, 1.0]]


def test_error_accumulator_matches_direct_computation():
    w = _weights()
    scale = channel_scales(w, "int8")
    deq = dequantize(quantize_rows(w, scale, "int8"), scale)
    whole = ErrorAccumulator()
    whole.add(w, deq)
    chunked = ErrorAccumulator()
    for a, b in ((0, 10), (10, 48)):
        part = ErrorAccumulator()
        part.add(w[a:b], deq[a:b])
        chunked.merge(part)
    direct = (torch.linalg.norm(w - deq) / torch.linalg.norm(w)).item()
    assert whole.relative_error == pytest.approx(direct, rel=1e-5)
    assert chunked.relative_error == pytest.approx(whole.relative_error, rel=1e-9)
    assert whole.snr_db == pytest.approx(-20 * math.log10(direct), rel=1e-5)
    assert whole.max_abs_error == pytest.approx((w - deq).abs().max().item())


def test_exact_quantization_has_no_finite_snr():
    w = torch.tensor([[127.0, -64.0, 0.0]])
    scale = channel_scales(w, "int8")  # exactly 1.0: every value is representable
    acc = ErrorAccumulator()
    acc.add(w, dequantize(quantize_rows(w, scale, "int8"), scale))
    assert acc.relative_error == 0.0 and acc.snr_db is None
