"""Casts between the floating dtypes weights come in (F32, F16, BF16), without torch: numpy on the stored bytes.

Bit for bit what torch's CPU ``Tensor.to`` gives for every value but NaN: widening is exact, narrowing rounds to
nearest-even (bfloat16 by torch's own bias formula, float16 by IEEE conversion), overflow gives inf. A NaN's bits are
torch's business (they differ between its scalar and vector paths), so rows holding one are left to torch.

Example::

    cast = cast_floats(raw_f32_rows, "F32", "BF16")
    cast.data, cast.overflow        # the BF16 bytes; whether a finite value became inf
"""

from __future__ import annotations

from typing import NamedTuple

CODES = ("F32", "F16", "BF16")


class FloatCast(NamedTuple):
    data: bytes
    overflow: bool  # a finite value became inf (the caller refuses to write it)


def cast_floats(raw: bytes, source: str, target: str) -> FloatCast | None:
    """``raw`` (values of dtype ``source``, little-endian) cast to ``target``; None when a value is NaN.

    Few passes over the data: NaN, inf and overflow all follow from the largest magnitude alone (every cast here
    is monotonic in magnitude, so the largest magnitude casts to the largest one: overflow is that one becoming
    inf), and the bfloat16 rounding runs in place."""
    import numpy as np

    if source not in CODES or target not in CODES:
        raise ValueError(f"cast {source} -> {target}: only {', '.join(CODES)}")
    if source == "BF16" and target == "F16":
        return _bf16_to_f16(np, raw)
    wide = _to_f32(np, raw, source)
    bits = wide.view(np.uint32)
    magnitude = np.bitwise_and(bits, np.uint32(0x7FFFFFFF))
    top = int(magnitude.max()) if magnitude.size else 0
    if top > _F32_INF:
        return None  # a NaN: its bits are torch's business
    if target == "F32":
        return FloatCast(wide.tobytes(), False)
    if target == "F16":
        with np.errstate(over="ignore"):  # overflow is reported, not warned about
            out = wide.astype(np.float16)
            top_cast = np.array([top], dtype=np.uint32).view(np.float32).astype(np.float16)
        return FloatCast(out.tobytes(), top < _F32_INF and bool(np.isinf(top_cast[0])))
    # round to nearest even on the upper 16 bits: c10::BFloat16's round_to_nearest_even. No NaN here, so no lane
    # overflows 32 bits; ``magnitude`` is reused as the scratch buffer.
    rounded = np.right_shift(bits, np.uint32(16), out=magnitude)
    rounded &= np.uint32(1)
    rounded += np.uint32(0x7FFF)
    rounded += bits
    rounded >>= np.uint32(16)
    top_bf16 = (top + 0x7FFF + ((top >> 16) & 1)) >> 16
    return FloatCast(rounded.astype(np.uint16).tobytes(), top < _F32_INF and top_bf16 >= _BF16_INF)


_F32_INF = 0x7F800000  # magnitude bits of float32 inf; larger ones are NaN
_BF16_INF = 0x7F80
# bfloat16 magnitudes (exponent and mantissa bits) of float16's normal range, 2**-14 <= |x| < 65536: exactly
# representable in float16 (7 mantissa bits fit in 10), the exponent rebiased from 127 to 15
_BF16_F16_NORMAL = (113 << 7, (143 << 7) - 1)


def _bf16_to_f16(np, raw: bytes) -> FloatCast | None:
    """BF16 -> F16 on 16-bit integers (EAGLE drafts are often fp16 for a bf16 target): values in float16's normal
    range move their bits (exact); the rest (zeros, float16 subnormals, overflow to inf) go through float32's cast."""
    bits = np.frombuffer(raw, dtype="<u2")
    magnitude = np.bitwise_and(bits, np.uint16(0x7FFF))
    top = int(magnitude.max()) if magnitude.size else 0
    if top > _BF16_INF:
        return None  # a NaN: its bits are torch's business
    low, high = _BF16_F16_NORMAL
    # (e << 7 | m) << 3 - (112 << 10) is float16's (e - 112) << 10 | m << 3; uint16 arithmetic wraps to exactly that
    out = np.left_shift(magnitude, np.uint16(3))
    out -= np.uint16(0xC000)
    out |= np.bitwise_and(bits, np.uint16(0x8000))
    other = np.flatnonzero((magnitude < low) | (magnitude > high))
    if other.size:
        with np.errstate(over="ignore"):
            out[other] = _to_f32(np, bits[other].tobytes(), "BF16").astype(np.float16).view(np.uint16)
    return FloatCast(out.tobytes(), high < top < _BF16_INF)


def _to_f32(np, raw: bytes, code: str):
    if code == "F32":
        return np.frombuffer(raw, dtype="<f4")
    if code == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
