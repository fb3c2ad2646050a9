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
    """``raw`` (values of dtype ``source``, little-endian) cast to ``target``; None when a value is NaN."""
    import numpy as np

    if source not in CODES or target not in CODES:
        raise ValueError(f"cast {source} -> {target}: only {', '.join(CODES)}")
    wide = _to_f32(np, raw, source)
    if np.isnan(wide).any():
        return None
    if target == "F32":
        out, back = wide, wide
    elif target == "F16":
        with np.errstate(over="ignore"):  # overflow is reported, not warned about
            out = wide.astype(np.float16)
        back = out
    else:
        bits = wide.view(np.uint32)
        # round to nearest even on the upper 16 bits: c10::BFloat16's round_to_nearest_even
        out = ((bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16))
        out = out.astype(np.uint16)
        back = _to_f32(np, out.tobytes(), "BF16")
    overflow = bool(not np.isfinite(back).all() and np.isfinite(wide).all())
    return FloatCast(out.tobytes(), overflow)


def _to_f32(np, raw: bytes, code: str):
    if code == "F32":
        return np.frombuffer(raw, dtype="<f4")
    if code == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
