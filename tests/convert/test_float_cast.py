"""float_cast: casts of stored bytes (the C module and numpy, each) equal torch's CPU casts bit for bit (NaN rows are
left to torch)."""

import itertools

import pytest
import torch

from neuronpack.convert import float_cast
from neuronpack.convert.float_cast import FloatCaster, cast_floats


@pytest.fixture(autouse=True, params=["C", "numpy"])
def implementation(request, monkeypatch):
    """Every test runs on both implementations: the C module (_float_cast.c) and numpy (where it was not built)."""
    if request.param == "numpy":
        monkeypatch.setattr(float_cast, "compiled_casts", lambda: None)
    return request.param


def test_the_c_module_is_built_with_the_package(implementation):
    """setup.py builds it at install time (optional: a machine without a C compiler falls back to numpy); this
    environment has a compiler, so a missing module means the build broke."""
    if implementation == "C":
        assert float_cast.compiled_casts() is not None
        assert FloatCaster("F32", "BF16")._c is not None
    else:
        assert FloatCaster("F32", "BF16")._c is None

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _values() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    spread = torch.cat([torch.randn(20000, generator=gen) * scale for scale in (1e-6, 1e-3, 1.0, 1e3, 1e5)])
    edges = torch.tensor([0.0, -0.0, 1e-45, -1e-40, 3e-39, 1.1754942e-38, 2.98e-8, 5.96e-8, -6.0e-8, 6.1e-5,
                          65504.0, 65519.0, 65520.0, -65520.0, 3.3895e38, float("inf"), float("-inf")])
    # float32 values exactly halfway between two bfloat16 values: round-to-nearest-even decides
    ties = ((torch.randint(0, 2**31 - 2**24, (2000,), generator=gen) & ~0xFFFF) | 0x8000).to(torch.int32)
    return torch.cat([spread, edges, ties.view(torch.float32)])


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize(("source", "target"), list(itertools.permutations(DTYPES, 2)))
def test_every_cast_equals_torchs_bit_for_bit(source, target):
    values = _values().to(DTYPES[source])
    cast = cast_floats(_bytes(values), source, target)
    assert cast is not None and cast.data == _bytes(values.to(DTYPES[target]))


def test_overflow_is_reported_and_nan_is_left_to_torch():
    finite = torch.tensor([1.0, 1e6])
    assert cast_floats(_bytes(finite), "F32", "F16").overflow is True
    assert cast_floats(_bytes(finite), "F32", "BF16").overflow is False
    assert cast_floats(_bytes(torch.tensor([1.0, float("inf")])), "F32", "F16").overflow is False  # inf stays inf
    assert cast_floats(_bytes(torch.tensor([1.0, float("nan")])), "F32", "BF16") is None
    with pytest.raises(ValueError, match="only F32, F16, BF16"):
        cast_floats(b"\0", "I8", "F16")


@pytest.mark.parametrize(("source", "target"), [("F32", "BF16"), ("F32", "F16"), ("BF16", "F16")])
@pytest.mark.parametrize("edge", [65504.0, 65519.0, 65520.0, -65520.0, 3.3895e38, 3.3961e38, -3.3962e38, 1e6])
def test_overflow_is_exactly_a_finite_value_becoming_inf(source, target, edge):
    # the largest magnitude decides overflow: compare with torch at the edges of float16 and bfloat16
    finite = _values()[torch.isfinite(_values())]
    values = torch.cat([finite[finite.abs() < 6e4], torch.tensor([edge])]).to(DTYPES[source])
    cast = cast_floats(_bytes(values), source, target)
    expected = values.to(DTYPES[target])
    assert cast is not None and cast.data == _bytes(expected)
    assert cast.overflow == bool(torch.isinf(expected).any() and torch.isfinite(values).all())


@pytest.mark.parametrize(("source", "target"), [("BF16", "F16"), ("BF16", "F32"), ("F16", "BF16"), ("F16", "F32")])
def test_every_16_bit_pattern_casts_like_torch(source, target):
    patterns = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(DTYPES[source])
    values = patterns[~torch.isnan(patterns)]  # every non-NaN value of the 16-bit dtype
    cast = cast_floats(_bytes(values), source, target)
    assert cast is not None and cast.data == _bytes(values.to(DTYPES[target]))


@pytest.mark.parametrize(("source", "target"), [("F32", "BF16"), ("BF16", "F16"), ("F16", "F32")])
def test_a_caster_casts_block_by_block_into_a_reused_buffer(source, target):
    values = _values()[_values().abs() < 6e4].to(DTYPES[source])  # finite, no overflow in float16
    caster = FloatCaster(source, target, block=1000)  # ~100 blocks, the last one partial
    out = bytearray(values.numel() * DTYPES[target].itemsize)
    for _ in range(2):
        assert caster.cast_into(_bytes(values), memoryview(out)) is False
        assert bytes(out) == _bytes(values.to(DTYPES[target]))
    late_nan = values.clone()
    late_nan[-1] = float("nan")  # in the last block: found after every other block was cast
    assert caster.cast_into(_bytes(late_nan), out) is None
    with pytest.raises(ValueError, match="do not fit"):
        caster.cast_into(_bytes(values), out[:-4])
