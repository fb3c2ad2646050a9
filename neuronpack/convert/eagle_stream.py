"""The tensors of an EAGLE conversion as a stream of chunks for the safetensors writer (``TensorStream``), in the
order of the plan (eagle_layouts.py): a tensor kept as stored is handed over as its ``TensorInfo`` (the writer copies
its bytes kernel-side), a safetensors tensor that is cast is cast on its stored bytes in row chunks (``float_cast``,
bit for bit torch's cast); only a ``.bin`` source, rows holding a NaN or a replaced head being compared go through
torch, in row chunks.

Example::

    stream = TensorStream(plan, draft_ckpt, target_ckpt)
    write_safetensors_sharded(staging, specs, stream.chunks())
    stream.head_identical        # None unless the draft's own head was replaced
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from neuronpack.checkpoint import Checkpoint
from neuronpack.checkpoint.dtypes import torch_dtype
from neuronpack.checkpoint.safetensors_header import TensorInfo, expected_nbytes
from neuronpack.convert.eagle_layouts import HEAD, EaglePlan, OutputTensor
from neuronpack.convert.float_cast import FloatCaster
from neuronpack.errors import ConversionError

if TYPE_CHECKING:
    import torch

# Row chunks of about this many bytes bound the memory a large tensor (head, embedding) needs while it streams.
# 64 MiB chunks were not faster (bench/eagle.py).
CHUNK_BYTES = 16 * 2**20
# Rows cast without torch go in smaller chunks: read, cast and written while they are still in the CPU cache. The
# 1b-cast draft of bench/convert_eagle.py converted in 0.69 s with 1-2 MiB chunks, 0.74 s with 4 and 1.13 s with 16.
RAW_CHUNK_BYTES = 2 * 2**20


class TensorStream:
    """Yields (name, tensor) in plan order for the writer; compares a replaced head with the new one on the way.

    Rows cast without torch are read into one buffer and cast into another, both reused for every chunk: the writer
    writes a chunk before it asks for the next (``write_safetensors_sharded``), so no chunk allocates memory."""

    def __init__(self, plan: EaglePlan, draft: Checkpoint, target: Checkpoint) -> None:
        self.plan = plan
        self.draft = draft
        self.target = target
        self.head_identical: bool | None = None
        if plan.replaces_head:
            old = draft.info(HEAD)
            new = next(t for t in plan.tensors if t.name == HEAD)
            self.head_identical = old.dtype == new.dtype and tuple(old.shape) == new.shape
        self._casters: dict[tuple[str, str], FloatCaster] = {}
        self._raw = bytearray()  # stored rows read for a cast
        self._cast = bytearray()  # their cast bytes

    def chunks(self) -> Iterator[tuple[str, torch.Tensor | bytes | memoryview | TensorInfo]]:
        # Reading the next chunk in a worker thread, to overlap it with the write, measured no faster on the 2 busy
        # cores of the build machine (4.4-7.7 s either way), so the stream stays single-threaded.
        for spec in self.plan.tensors:
            ckpt = self.draft if spec.source == "draft" else self.target
            if self._copied_as_stored(spec, ckpt):
                yield spec.name, ckpt.info(spec.source_name)  # the writer copies its bytes kernel-side
                continue
            raw = self._castable_without_torch(spec, ckpt)
            for start, stop in _row_ranges(spec, RAW_CHUNK_BYTES if raw else CHUNK_BYTES):
                cast = self._cast_without_torch(spec, ckpt, start, stop) if raw else None
                if cast is not None:
                    yield spec.name, cast
                    continue
                rows = ckpt.get_rows(spec.source_name, start, stop) if spec.shape else ckpt.get(spec.source_name)
                rows = _cast(spec, rows)
                if self._comparing(spec):
                    import torch

                    self.head_identical = torch.equal(rows, self.draft.get_rows(HEAD, start, stop))
                yield spec.name, rows

    def _comparing(self, spec: OutputTensor) -> bool:
        """Whether the tensor is the head, still being compared with the draft's old one: it goes through torch
        (torch.equal decides "identical")."""
        return spec.name == HEAD and bool(self.head_identical)

    def _copied_as_stored(self, spec: OutputTensor, ckpt: Checkpoint) -> bool:
        """Unchanged safetensors bytes are copied file to file: no torch, no pages of them in this process (not a
        head being compared)."""
        return not spec.cast and not self._comparing(spec) and ckpt.format == "safetensors"

    def _castable_without_torch(self, spec: OutputTensor, ckpt: Checkpoint) -> bool:
        """Whether rows of the tensor are cast on their stored bytes: not for a .bin source, a scalar or a head
        being compared."""
        return spec.cast and not self._comparing(spec) and bool(spec.shape) and ckpt.format == "safetensors"

    def _cast_without_torch(self, spec: OutputTensor, ckpt: Checkpoint, start: int, stop: int) -> memoryview | None:
        """Rows of a safetensors tensor cast on their stored bytes (``float_cast``: numpy, bit for bit torch's cast),
        as a view of the reused cast buffer; None when a row holds a NaN (torch casts those rows)."""
        caster = self._casters.get((spec.source_dtype, spec.dtype))
        if caster is None:
            caster = self._casters[spec.source_dtype, spec.dtype] = FloatCaster(spec.source_dtype, spec.dtype)
        rows = (stop - start, *spec.shape[1:])
        raw_size, cast_size = expected_nbytes(spec.source_dtype, rows), expected_nbytes(spec.dtype, rows)
        if len(self._raw) < raw_size or len(self._cast) < cast_size:  # new buffers: views of the old ones may live on
            self._raw, self._cast = bytearray(raw_size), bytearray(cast_size)
        raw = ckpt.raw_rows(spec.source_name, start, stop, into=self._raw)
        out = memoryview(self._cast)[:cast_size]
        overflow = caster.cast_into(raw, out)
        if overflow:
            raise _overflow(spec)
        return None if overflow is None else out


def _cast(spec: OutputTensor, rows: torch.Tensor) -> torch.Tensor:
    """Cast a chunk to its output dtype; refuse an overflow (|x| > 65504 in float16) rather than write inf."""
    if not spec.cast:
        return rows
    import torch

    cast = rows.to(torch_dtype(spec.dtype))
    # aminmax is one cheap pass (isfinite over the whole chunk cost as much as the cast); NaN/inf show up in it.
    if cast.numel() and not all(torch.isfinite(v) for v in torch.aminmax(cast)):
        if all(torch.isfinite(v) for v in torch.aminmax(rows)):
            raise _overflow(spec)
    return cast


def _overflow(spec: OutputTensor) -> ConversionError:
    return ConversionError(
        f"{spec.name} overflows when cast from {spec.source_dtype} to {spec.dtype}",
        where=f"{spec.source} tensor {spec.source_name}",
        fix="choose a wider --dtype (bfloat16 or float32)",
    )


def _row_ranges(spec: OutputTensor, chunk_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) row ranges of about ``chunk_bytes`` each (one range for scalars and empty tensors)."""
    if not spec.shape or spec.shape[0] == 0:
        return [(0, spec.shape[0] if spec.shape else 0)]
    rows = spec.shape[0]
    row_bytes = max(1, _nbytes(spec) // rows)
    step = max(1, chunk_bytes // row_bytes)
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def _nbytes(spec: OutputTensor) -> int:
    return max(expected_nbytes(spec.source_dtype, spec.shape), expected_nbytes(spec.dtype, spec.shape))
