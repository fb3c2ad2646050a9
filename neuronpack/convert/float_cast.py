"""Casts between the floating dtypes weights come in (F32, F16, BF16), without torch: on the stored bytes.

Bit for bit what torch's CPU ``Tensor.to`` gives for every value but NaN: widening is exact, narrowing rounds to
nearest-even (bfloat16 by torch's own bias formula, float16 by IEEE conversion), overflow gives inf. A NaN's bits are
torch's business (they differ between its scalar and vector paths), so rows holding one are left to torch.

Two implementations of the same casts: ``_float_cast.c``, built with the package (one pass in C, the GIL released;
no numpy, whose import alone was a quarter of a small draft's conversion), and numpy, where the C module was not
built (no C compiler at install time). numpy's ``FloatCaster`` casts in blocks of ``BLOCK`` values through scratch
arrays it keeps: every pass over a block stays in the CPU cache and nothing is allocated per call. bf16 -> fp16
moves the bits of values in fp16's normal range, bf16 -> fp32 is a shift, the other 16-bit sources (and the bf16
values outside fp16's normal range) are looked up in a 65536-entry table made once from an exact cast of every bit
pattern.

Example::

    cast = cast_floats(raw_f32_rows, "F32", "BF16")
    cast.data, cast.overflow        # the BF16 bytes; whether a finite value became inf

    caster = FloatCaster("BF16", "F16")
    overflow = caster.cast_into(raw_bf16_rows, out)     # out: a writable buffer of the F16 bytes; None: a NaN
"""

from __future__ import annotations

import functools
from typing import NamedTuple

CODES = ("F32", "F16", "BF16")
ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}
# Values per block: a block's source, scratch and output (~1.5 MiB for F32 -> BF16) stay in a core's 2 MiB L2 cache.
BLOCK = 1 << 17
_INF = {"F32": 0x7F800000, "F16": 0x7C00, "BF16": 0x7F80}  # magnitude bits of inf; larger ones are NaN
_MAGNITUDE = {"F32": 0x7FFFFFFF, "F16": 0x7FFF, "BF16": 0x7FFF}


class FloatCast(NamedTuple):
    data: bytes
    overflow: bool  # a finite value became inf (the caller refuses to write it)


def cast_floats(raw: bytes, source: str, target: str) -> FloatCast | None:
    """``raw`` (values of dtype ``source``, little-endian) cast to ``target``; None when a value is NaN.

    Example: ``cast_floats(raw, "BF16", "F16").data`` -> the float16 bytes."""
    caster = FloatCaster(source, target)
    out = bytearray(len(raw) // ITEMSIZE[source] * ITEMSIZE[target])
    overflow = caster.cast_into(raw, out)
    return None if overflow is None else FloatCast(bytes(out), overflow)


class FloatCaster:
    """Casts stored values from ``source`` to ``target`` into a caller's buffer (see the module docstring).

    NaN, inf and overflow all follow from the largest magnitude alone: every cast here is monotonic in magnitude, so
    the largest magnitude casts to the largest one, and overflow is that one becoming inf."""

    def __init__(self, source: str, target: str, *, block: int = BLOCK) -> None:
        if source not in CODES or target not in CODES:
            raise ValueError(f"cast {source} -> {target}: only {', '.join(CODES)}")
        self.source, self.target, self.block = source, target, block
        self._c = compiled_casts()  # the C module where it was built; else numpy, below
        if self._c is not None:
            return
        import numpy as np

        self._np = np
        self._src_type = np.dtype(f"<u{ITEMSIZE[source]}")
        self._dst_type = np.dtype(f"<u{ITEMSIZE[target]}")
        self._magnitude = np.empty(block, self._src_type)  # scratch: |x| bits of a block
        self._scratch = np.empty(block, np.uint32 if source == "F32" else np.uint16)
        self._mask = np.empty(block, np.bool_)
        self._table = _table(source, target) if ITEMSIZE[source] == 2 and source != target else None

    def cast_into(self, raw, out) -> bool | None:
        """Cast the values of ``raw`` (bytes-like) into ``out`` (a writable bytes-like of exactly their cast size).
        Returns whether a finite value overflowed to inf; None when a value is NaN (``out`` then holds a part)."""
        if self._c is not None:  # it checks the sizes itself (ValueError)
            state = self._c.cast_into(raw, self.source, out, self.target)
            return None if state < 0 else bool(state)
        np = self._np
        src = np.frombuffer(raw, dtype=self._src_type)
        dst = np.frombuffer(out, dtype=self._dst_type)
        if dst.size != src.size:
            raise ValueError(f"{src.size} {self.source} values do not fit {len(out)} bytes of {self.target}")
        top = 0
        for start in range(0, src.size, self.block):
            block, into = src[start:start + self.block], dst[start:start + self.block]
            magnitude = np.bitwise_and(block, _MAGNITUDE[self.source], out=self._magnitude[:block.size])
            block_top = int(magnitude.max())
            if block_top > _INF[self.source]:
                return None  # a NaN: its bits are torch's business
            top = max(top, block_top)
            self._cast_block(block, into, magnitude, block_top)
        return top < _INF[self.source] and self._casts_to_inf(top)

    def _cast_block(self, block, into, magnitude, top: int) -> None:
        """Cast ``block`` into ``into``; ``magnitude``: the block's |x| bits, ``top`` their largest (no NaN)."""
        np = self._np
        if self.source == "BF16" and self.target == "F16":
            self._bf16_to_f16(block, into, magnitude, top)
        elif self.source == "BF16" and self.target == "F32":
            np.left_shift(block, np.uint32(16), out=into)  # exact: bfloat16 is float32's upper half
        elif self._table is not None:
            np.take(self._table, block, out=into, mode="clip")  # clip: no bounds check (a u16 index is in range)
        elif self.source == self.target:
            np.copyto(into, block)
        elif self.target == "BF16":
            _round_to_bf16(np, block, into, self._scratch[:block.size])
        else:  # F32 -> F16: IEEE conversion, round to nearest even
            with np.errstate(over="ignore"):  # overflow is reported, not warned about
                np.copyto(into.view(np.float16), block.view(np.float32), casting="same_kind")

    def _bf16_to_f16(self, block, into, magnitude, top: int) -> None:
        """EAGLE drafts are often fp16 for a bf16 target: values in float16's normal range move their bits (exact,
        a few integer passes); the rest (zeros, float16 subnormals, overflow to inf; ~0.3% of a weight matrix) are
        looked up in the table."""
        np = self._np
        size = block.size
        # magnitude is (e << 7 | m), and (e << 7 | m) << 3 - (112 << 10) is float16's (e - 112) << 10 | m << 3:
        # uint16 arithmetic wraps to exactly that (+ 0x4000 == - 0xC000); the sign bit is put back after
        np.left_shift(magnitude, 3, out=into)
        np.add(into, 0x4000, out=into)
        np.bitwise_or(into, np.bitwise_and(block, 0x8000, out=self._scratch[:size]), out=into)
        low, high = _BF16_F16_NORMAL
        other = np.less(magnitude, low, out=self._mask[:size])
        if top > high:
            np.logical_or(other, np.greater(magnitude, high), out=other)
        where = np.flatnonzero(other)
        if where.size:
            np.put(into, where, np.take(self._table, np.take(block, where)))

    def _casts_to_inf(self, top: int) -> bool:
        np = self._np
        one = np.array([top], dtype=self._src_type)
        cast = np.empty(1, dtype=self._dst_type)
        self._cast_block(one, cast, one, top)  # top is a magnitude: its own |x| bits
        return int(cast[0]) & _MAGNITUDE[self.target] == _INF[self.target]


def compiled_casts():
    """The C module of these casts (``_float_cast.c``), or None where it was not built."""
    try:
        from neuronpack.convert import _float_cast
    except ImportError:
        return None
    return _float_cast


def warm_up(casts: set[tuple[str, str]]) -> None:
    """Without the C module: import numpy and make the tables of these (source, target) casts now, e.g. in a thread
    while other work runs (the first ``FloatCaster`` would wait for both)."""
    if compiled_casts() is not None:
        return
    import numpy  # noqa: F401

    for source, target in casts:
        if source in CODES and target in CODES and ITEMSIZE[source] == 2 and source != target:
            _table(source, target)


def _round_to_bf16(np, bits, into, scratch) -> None:
    """float32 bits -> bfloat16 bits, rounded to nearest even on the upper 16 bits: c10::BFloat16's
    round_to_nearest_even. Only for NaN-free values, so no lane overflows 32 bits."""
    rounded = np.right_shift(bits, 16, out=scratch)
    rounded &= 1
    rounded += 0x7FFF
    rounded += bits
    rounded >>= 16
    np.copyto(into, rounded, casting="unsafe")  # the upper 16 bits are zero now


# bfloat16 magnitudes (exponent and mantissa bits) of float16's normal range, 2**-14 <= |x| < 65536: exactly
# representable in float16 (7 mantissa bits fit in 10), the exponent rebiased from 127 to 15
_BF16_F16_NORMAL = (113 << 7, (143 << 7) - 1)


@functools.cache
def _table(source: str, target: str):
    """The ``target`` bits of every ``source`` bit pattern (16-bit sources): their float32 value (exact) cast to
    ``target``; NaN patterns are never looked up."""
    import numpy as np

    patterns = np.arange(2**16, dtype=np.uint32)
    wide = (patterns << 16) if source == "BF16" else patterns.astype(np.uint16).view(np.float16).astype(np.float32)
    wide = np.ascontiguousarray(wide).view(np.uint32)
    out = np.empty(2**16, dtype=f"<u{ITEMSIZE[target]}")
    if target == "F32":
        out[:] = wide
    elif target == "BF16":
        finite = np.bitwise_and(wide, 0x7FFFFFFF) <= _INF["F32"]
        _round_to_bf16(np, np.where(finite, wide, 0).astype(np.uint32), out, np.empty(2**16, np.uint32))
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            out[:] = wide.view(np.float32).astype(np.float16).view(np.uint16)
    out.flags.writeable = False
    return out
