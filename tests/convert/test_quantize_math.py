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
    q, scale = quantize_rows(w, dtype)
    assert scale.shape == (48, 1) and scale.dtype == torch.float32
    assert torch.equal(scale, channel_scales(w, dtype))
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
    q, same_scale = quantize_rows(w, dtype, scale)
    assert same_scale is scale
    assert q.float().abs().max().item() == (127 if dtype == "int8" else 240)
    err = (w - dequantize(q, scale)).abs()
    assert torch.all(err <= error_bound(w, scale, dtype))


def test_int8_rounds_to_nearest_step():
    q, _ = quantize_rows(torch.tensor([[1.0, -2.0, 0.0, 2.0 / 127 * 10.4]]), "int8")
    assert q.tolist() == [[64, -127, 0, 10]]


def test_fp8_never_exceeds_neuron_bound_of_240():
    # Values beyond amax (cannot happen with our scales, but a caller could pass a smaller scale) clamp to 240.
    q, _ = quantize_rows(torch.tensor([[1000.0, -1000.0, 1.0]]), "fp8", torch.tensor([1.0]))
    assert q.float().tolist() == [[240.0, -240.0, 1.0]]


SCHEMES = [("int8", "per-channel"), ("fp8", "per-channel"), ("int8", "per-tensor")]


@pytest.mark.parametrize("dtype, granularity", SCHEMES)
def test_error_statistics_match_direct_computation(dtype, granularity):
    w = _weights(torch.bfloat16)
    tensor_scale = scale_from_amax(torch.tensor([chunk_amax(w)]), dtype) if granularity == "per-tensor" else None
    whole, chunked = ErrorAccumulator(), ErrorAccumulator()
    q, scale = quantize_rows(w, dtype, tensor_scale, stats=whole)
    for a, b in ((0, 10), (10, 48)):  # the same rows in two chunks, merged
        part = ErrorAccumulator()
        quantize_rows(w[a:b], dtype, tensor_scale, stats=part)
        chunked.merge(part)
    w32 = w.float()
    direct = (torch.linalg.norm(w32 - dequantize(q, scale)) / torch.linalg.norm(w32)).item()
    assert whole.relative_error == pytest.approx(direct, rel=1e-4)
    assert chunked.relative_error == pytest.approx(whole.relative_error, rel=1e-9)
    assert whole.snr_db == pytest.approx(-20 * math.log10(direct), rel=1e-4)


def test_exact_quantization_has_no_finite_snr():
    acc = ErrorAccumulator()
    quantize_rows(torch.tensor([[127.0, -64.0, 0.0]]), "int8", stats=acc)  # scale 1.0: every value representable
    assert acc.relative_error == 0.0 and acc.snr_db is None
