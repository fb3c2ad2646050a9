"""A streaming safetensors writer: the shard layout is planned from tensor specs, so every header is written before
its data and tensors are streamed to disk in row chunks. Peak memory is about one chunk, however large the model.

Example::

    specs = [TensorSpec("w", torch.int8, (4096, 4096)), TensorSpec("w_scale", torch.float32, (4096, 1))]

    def chunks():
        for start in range(0, 4096, 512):           # 512 rows at a time
            yield "w", quantized_rows(start, start + 512)
        yield "w_scale", scales

    write_safetensors_sharded(out_dir, specs, chunks(), max_shard_bytes=2 * 2**30)

A tensor copied unchanged from a safetensors file arrives as its ``TensorInfo`` (``read_safetensors_header``)
instead of a tensor: its bytes go from file to file inside the kernel (``os.copy_file_range``), never through this
process, and neither torch nor the source's pages in this process are needed for it. Such copies run in a worker
thread, each at its own offset of the shard, while the caller goes on producing the tensors after it (the kernel
copies with the GIL released): convert-eagle casts the target's head while the draft's tensors are copied.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import struct
import threading
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NamedTuple, Union

from neuronpack.checkpoint.dtypes import safetensors_dtype
from neuronpack.checkpoint.safetensors_header import TensorInfo, expected_nbytes
from neuronpack.fsutil import BackgroundWork, FlushBehind
from neuronpack.progress import NullReporter, Reporter

if TYPE_CHECKING:
    import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 4 * 2**30
# A kernel-side copy falls back to reads and writes of this size where copy_file_range cannot copy.
_COPY_CHUNK = 16 * 2**20
# With flush_behind, kernel-side copies go in pieces of this size, so writeback can start on each piece (16 MiB
# pieces and fdatasyncs: convert-eagle of a 120 MB draft 20 ms faster than 64 MiB, 8 MiB slower again).
_FLUSH_PIECE = 16 * 2**20
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF, errno.EPERM)

# What a chunk may be: rows of a tensor, their raw little-endian bytes (already in the spec's dtype; bytes or a
# memoryview of a buffer the producer reuses), or a whole stored tensor copied unchanged (TensorInfo of a safetensors
# file).
Chunk = Union["torch.Tensor", bytes, memoryview, TensorInfo]


class TensorSpec(NamedTuple):
    """A tensor the writer will receive: its name, dtype (a torch dtype or a safetensors code such as "BF16") and
    full shape."""

    name: str
    dtype: torch.dtype | str
    shape: tuple[int, ...]


class _Shard(NamedTuple):
    filename: str
    specs: list[TensorSpec]
    header: bytes  # length prefix + JSON header padded to a multiple of 8


def write_safetensors_sharded(
    out_dir: Path,
    specs: Sequence[TensorSpec],
    chunks: Iterable[tuple[str, Chunk]],
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    metadata: dict[str, str] | None = None,
    reporter: Reporter | None = None,
    flush_behind: bool = False,
) -> list[Path]:
    """Stream tensors into safetensors shards in ``out_dir``; return the shard paths in order.

    ``chunks`` yields ``(name, tensor)`` in ``specs`` order; a tensor may arrive as several consecutive row chunks
    (concatenated along dim 0), as raw bytes of whole rows in the spec's dtype, or whole as the ``TensorInfo`` of a
    safetensors tensor to copy unchanged. A chunk is written before the next one is asked for, so a producer may
    yield views of one buffer it refills for every chunk. One shard
    is written as ``model.safetensors``; several as ``model-00001-of-0000N.safetensors`` plus
    ``model.safetensors.index.json``, the way transformers writes them.
    A chunk with the wrong name, dtype or trailing shape, or a tensor with too few/many bytes, raises ValueError
    (a programming error in the caller). ``metadata`` goes into every shard's ``__metadata__`` (``format: pt`` is
    added when absent, as transformers requires it). ``flush_behind``: tensors copied kernel-side go to disk while
    the next are copied (``fsutil.FlushBehind``), for a caller that fsyncs the shards before publishing.

    Example::

        specs = [TensorSpec("lm_head.weight", torch.float16, (32000, 4096))]
        rows = ((s.name, t) for t in big.split(1024))       # 1024-row chunks
        write_safetensors_sharded(staging, specs, rows)     # -> [staging / "model.safetensors"]
    """
    reporter = reporter or NullReporter()
    out_dir = Path(out_dir)
    if max_shard_bytes <= 0:
        raise ValueError("max_shard_bytes must be positive")
    _check_unique(specs)
    metadata = {"format": "pt", **(metadata or {})}
    shards = _plan_shards(specs, max_shard_bytes, metadata)
    stream = _ChunkStream(chunks)
    paths = []
    with reporter.task("write safetensors", total=len(specs)) as task:
        for shard in shards:
            path = out_dir / shard.filename
            with open(path, "wb") as fh, (FlushBehind(fh) if flush_behind else nullcontext()) as flush, \
                    _StoredCopies(fh, flush) as copies:
                fh.write(shard.header)
                for spec in shard.specs:
                    _write_tensor(fh, spec, stream, copies, flush)
                    task.advance()
            paths.append(path)
    stream.expect_end()
    if len(shards) > 1:
        _write_index(out_dir, shards)
    return paths


def _code(dtype: torch.dtype | str) -> str:
    """The safetensors code of a spec's or chunk's dtype."""
    return dtype if isinstance(dtype, str) else safetensors_dtype(dtype)


def _spec_nbytes(spec: TensorSpec) -> int:
    return expected_nbytes(_code(spec.dtype), tuple(spec.shape))


def _check_unique(specs: Sequence[TensorSpec]) -> None:
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ValueError(f"tensor {spec.name!r} appears twice in specs")
        seen.add(spec.name)


def _plan_shards(specs: Sequence[TensorSpec], max_bytes: int, metadata: dict[str, str]) -> list[_Shard]:
    """Greedy split in spec order (like transformers): start a new shard when the next tensor would not fit;
    a tensor larger than max_bytes gets a shard of its own."""
    groups: list[list[TensorSpec]] = []
    size = 0
    for spec in specs:
        nbytes = _spec_nbytes(spec)
        if not groups or (size + nbytes > max_bytes and groups[-1]):
            groups.append([])
            size = 0
        groups[-1].append(spec)
        size += nbytes
    if not groups:
        groups = [[]]
    count = len(groups)
    names = [SINGLE_FILE] if count == 1 else [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    return [_Shard(name, group, _encode_header(group, metadata)) for name, group in zip(names, groups, strict=True)]


def _encode_header(specs: list[TensorSpec], metadata: dict[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for spec in specs:
        nbytes = _spec_nbytes(spec)
        header[spec.name] = {
            "dtype": _code(spec.dtype),
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the format pads the header with spaces so the data section is 8-aligned
    return struct.pack("<Q", len(raw)) + raw


class _ChunkStream:
    """Wraps the caller's iterator with one chunk of look-ahead, so a tensor knows where it ends."""

    def __init__(self, chunks: Iterable[tuple[str, Chunk]]) -> None:
        self._it = iter(chunks)
        self._pending: tuple[str, Chunk] | None = None

    def peek(self) -> tuple[str, Chunk] | None:
        if self._pending is None:
            self._pending = next(self._it, None)
        return self._pending

    def take(self) -> tuple[str, Chunk]:
        item = self.peek()
        assert item is not None
        self._pending = None
        return item

    def expect_end(self) -> None:
        item = self.peek()
        if item is not None:
            raise ValueError(f"chunk for {item[0]!r} arrived after every spec was written (unknown or out of order)")


def _write_tensor(fh: BinaryIO, spec: TensorSpec, stream: _ChunkStream, copies: _StoredCopies,
                  flush: FlushBehind | None = None) -> None:
    want = _spec_nbytes(spec)
    written = 0
    while True:
        # Stop as soon as the tensor is complete; only an empty tensor needs to look ahead (for its empty chunks).
        if written == want and (want > 0 or not _next_is(stream, spec.name)):
            return
        item = stream.peek()
        if item is None:
            raise ValueError(f"chunks ended inside {spec.name!r}: got {written} of {want} bytes")
        name, chunk = item
        if name != spec.name:
            raise ValueError(f"expected a chunk of {spec.name!r} ({written} of {want} bytes so far), got {name!r}")
        stream.take()
        if isinstance(chunk, TensorInfo):
            _check_stored(spec, chunk, written)
            fh.seek(copies.submit(chunk) + chunk.nbytes)  # the next bytes go after it, while it is copied
            written += chunk.nbytes
            continue
        if isinstance(chunk, (bytes, memoryview)):
            data = memoryview(chunk).cast("B")
            _check_raw(spec, data, want)
        else:
            _check_chunk(spec, chunk)
            data = _as_bytes(chunk)
        if written + len(data) > want:
            raise ValueError(f"{spec.name!r}: chunks carry more than the {want} bytes of shape {tuple(spec.shape)}")
        fh.write(data)
        written += len(data)
        if flush is not None:
            flush.wrote(len(data))


def _next_is(stream: _ChunkStream, name: str) -> bool:
    item = stream.peek()
    return item is not None and item[0] == name


def _check_chunk(spec: TensorSpec, chunk: torch.Tensor) -> None:
    if _code(chunk.dtype) != _code(spec.dtype):
        raise ValueError(f"{spec.name!r}: chunk dtype {chunk.dtype} != spec dtype {spec.dtype}")
    # Row chunks concatenate along dim 0, so every other dimension must match the spec.
    if len(spec.shape) >= 2 and tuple(chunk.shape[1:]) != tuple(spec.shape[1:]):
        raise ValueError(f"{spec.name!r}: chunk shape {tuple(chunk.shape)} does not stack to {tuple(spec.shape)}")


def _check_raw(spec: TensorSpec, data: memoryview, want: int) -> None:
    rows = spec.shape[0] if spec.shape else 1
    if rows and len(data) % (want // rows or 1):
        raise ValueError(f"{spec.name!r}: {len(data)} raw bytes are not whole rows of {tuple(spec.shape)}")


def _check_stored(spec: TensorSpec, info: TensorInfo, written: int) -> None:
    """A stored tensor is copied whole, as the spec says it is (no rows of it, no dtype change)."""
    if written or info.dtype != _code(spec.dtype) or tuple(info.shape) != tuple(spec.shape) or info.offset is None:
        raise ValueError(f"{spec.name!r}: stored tensor {info.name} ({info.dtype}{list(info.shape)} in {info.file}) "
                         f"is not the whole {_code(spec.dtype)}{list(spec.shape)} of the spec")


class _StoredCopies(BackgroundWork):
    """Stored tensors copied into one shard by a worker thread, in the order given, each to the offset the shard's
    file position had when it was submitted: the caller moves on past it and writes what follows meanwhile. Closing
    waits for every copy and raises the first error one met; after an error in the caller's own writing the copies
    still queued are dropped (the shard is discarded anyway). A ``flush`` is told of copied pieces from the worker.
    """

    def __init__(self, fh: BinaryIO, flush: FlushBehind | None) -> None:
        self._fh, self._flush = fh, flush
        self._queue: queue.SimpleQueue[tuple[TensorInfo, int] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stop = False

    def submit(self, info: TensorInfo) -> int:
        """Queue ``info``'s bytes for the shard at its current position; return that offset."""
        self._raise_error()
        at = self._fh.tell()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="neuronpack-copy-stored", daemon=True)
            self._thread.start()
        self._queue.put((info, at))
        return at

    def close(self) -> None:
        """Wait for every queued copy; raise the first error one met."""
        self._join()
        self._raise_error()

    def _join(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None and not self._stop:
                try:
                    _copy_stored(self._fh.fileno(), *item, self._flush)
                except BaseException as exc:  # raised in the caller's thread by submit / close
                    self._error = exc

    def _abandon(self) -> None:  # after the caller's own error: the copies still queued are dropped
        self._stop = True
        self._join()


def _copy_stored(fd: int, info: TensorInfo, dst: int, flush: FlushBehind | None = None) -> None:
    """Write ``info.nbytes`` bytes of ``info.file`` from ``info.offset`` to ``fd`` at ``dst``: kernel-side with
    copy_file_range, else (another filesystem on an old kernel, a filesystem without it) through pread/pwrite.
    With ``flush``, in pieces of _FLUSH_PIECE bytes, each handed to it once copied."""
    kernel = hasattr(os, "copy_file_range")
    with open(info.file, "rb") as src:
        done = 0
        while done < info.nbytes:
            count, src_at, dst_at = info.nbytes - done, info.offset + done, dst + done
            if flush is not None:
                count = min(count, _FLUSH_PIECE)
            copied = None
            if kernel:
                try:
                    copied = os.copy_file_range(src.fileno(), fd, count, src_at, dst_at)
                except OSError as exc:
                    if exc.errno not in _NO_KERNEL_COPY:
                        raise
                    kernel = False
            if copied is None:
                copied = os.pwrite(fd, os.pread(src.fileno(), min(count, _COPY_CHUNK), src_at), dst_at)
            if copied == 0:
                raise ValueError(f"{info.file} ends inside {info.name} (changed while it was copied?)")
            done += copied
            if flush is not None:
                flush.wrote(copied)


def _as_bytes(chunk: torch.Tensor) -> memoryview:
    """The chunk's raw little-endian bytes without another copy (numpy has no bf16/fp8: view as uint8 first)."""
    import torch

    flat = chunk.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy()).cast("B")


def _write_index(out_dir: Path, shards: list[_Shard]) -> None:
    total = sum(_spec_nbytes(spec) for shard in shards for spec in shard.specs)
    weight_map = {spec.name: shard.filename for shard in shards for spec in shard.specs}
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=False) + "\n")
