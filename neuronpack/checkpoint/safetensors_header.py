"""Read and validate safetensors headers in pure Python (no torch import: the cache-hit path must stay torch-free).

A safetensors file is ``[u64 little-endian header length N][N bytes of JSON header][data section]``. The header maps
each tensor name to ``{"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}`` with offsets relative to the
start of the data section, plus an optional ``"__metadata__"`` object of strings.

Example::

    infos = read_safetensors_header(Path("model.safetensors"))
    infos["model.embed_tokens.weight"].shape     # (49152, 576)
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import NamedTuple

from neuronpack.errors import CheckpointError

# Bits per element of every dtype the safetensors format defines (sub-byte float types included).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

# The safetensors reference implementation refuses headers above 100 MB; a larger length means a corrupt file.
MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"


class TensorInfo(NamedTuple):
    """Where one tensor lives and what it is, without reading its data."""

    name: str
    dtype: str  # safetensors dtype string: "F32", "F16", "BF16", "I8", "F8_E4M3", "I64", "BOOL", ...
    shape: tuple[int, ...]
    file: Path
    nbytes: int
    offset: int | None = None  # where its bytes start in ``file`` (safetensors); None for .bin tensors


def expected_nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of ``dtype`` and ``shape`` occupies, e.g. ``expected_nbytes("BF16", (4, 3)) == 24``."""
    numel = 1
    for dim in shape:
        numel *= dim
    bits = numel * DTYPE_BITS[dtype]
    if bits % 8:
        raise ValueError(f"{numel} elements of {dtype} do not fill whole bytes")
    return bits // 8


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and validate the header of one safetensors file; return ``{name: TensorInfo}`` in data-offset order.

    Raises CheckpointError naming the file (and tensor) when the file is too short, the header length is absurd,
    the JSON is invalid, a dtype is unknown, offsets disagree with dtype*shape, tensors overlap or leave holes, or
    the data section is shorter than the header claims (a truncated download) or longer (trailing bytes, which the
    safetensors library refuses too).

    Example::

        for name, info in read_safetensors_header(Path("model.safetensors")).items():
            print(name, info.dtype, info.shape, info.nbytes)
    """
    path = Path(path)
    header, data_start, file_size = _read_raw_header(path)
    infos = []
    for name, entry in header.items():
        if name == METADATA_KEY:
            _check_metadata(path, entry)
            continue
        dtype, shape, begin, end = _parse_entry(path, name, entry)
        infos.append((begin, end, TensorInfo(name, dtype, shape, path, end - begin, data_start + begin)))
    infos.sort(key=lambda item: (item[0], item[1]))
    _check_layout(path, infos, data_size=file_size - data_start, file_size=file_size, data_start=data_start)
    return {info.name: info for _begin, _end, info in infos}


def duplicate_tensor_error(name: str, first: Path, second: Path) -> CheckpointError:
    """The error for one tensor name stored in two shards (any checkpoint format)."""
    return CheckpointError(
        f"duplicate tensor name {name!r} in two shards",
        where=f"{Path(first).name} and {Path(second).name}",
        fix="the checkpoint is inconsistent; re-export it with save_pretrained",
    )


def read_safetensors_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` strings of a safetensors file (``{}`` when absent), e.g. ``{"format": "pt"}``."""
    header, _start, _size = _read_raw_header(Path(path))
    metadata = header.get(METADATA_KEY) or {}
    _check_metadata(Path(path), metadata)
    return dict(metadata)


def _read_raw_header(path: Path) -> tuple[dict, int, int]:
    """Return (header dict, offset of the data section, file size)."""
    try:
        with open(path, "rb") as fh:
            file_size = fh.seek(0, 2)
            fh.seek(0)
            if file_size < 8:
                raise _bad(path, f"truncated: expected at least 8 bytes, file has {file_size}")
            (header_len,) = struct.unpack("<Q", fh.read(8))
            if header_len > MAX_HEADER_BYTES or header_len < 2:
                raise _bad(path, f"header length {header_len} is not sane (not a safetensors file?)")
            if 8 + header_len > file_size:
                raise _bad(path, f"truncated: expected {8 + header_len} header bytes, file has {file_size}")
            raw = fh.read(header_len)
    except OSError as exc:
        raise CheckpointError(
            f"cannot read safetensors file: {exc.strerror or exc}", where=str(path), fix="check the path exists"
        ) from None
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_not_json)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad(path, f"header is not valid JSON ({exc})") from None
    except RecursionError:
        raise _bad(path, "header is not valid JSON (nested too deeply)") from None
    if not isinstance(header, dict):
        raise _bad(path, "header is not a JSON object")
    try:
        # A lone UTF-16 surrogate escape such as \ud800 parses in Python but is not UTF-8 text: the safetensors
        # library refuses it, and printing such a tensor name would fail later.
        json.dumps(header, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(path, "header has a string that is not valid UTF-8 (a lone surrogate escape)") from None
    return header, 8 + header_len, file_size


def _parse_entry(path: Path, name: str, entry: object) -> tuple[str, tuple[int, ...], int, int]:
    if not isinstance(entry, dict):
        raise _bad(path, "header entry is not an object", tensor=name)
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise _bad(path, f"unknown dtype {dtype!r}", tensor=name)
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise _bad(path, f"shape {shape!r} is not a list of non-negative integers", tensor=name)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_uint(o) for o in offsets)):
        raise _bad(path, f"data_offsets {offsets!r} is not [begin, end]", tensor=name)
    begin, end = offsets
    try:
        want = expected_nbytes(dtype, tuple(shape))
    except ValueError as exc:
        raise _bad(path, str(exc), tensor=name) from None
    if end < begin or end - begin != want:
        raise _bad(
            path,
            f"header lies about offsets: {dtype}{list(shape)} needs {want} bytes, data_offsets [{begin}, {end}] "
            f"span {end - begin}",
            tensor=name,
        )
    return dtype, tuple(shape), begin, end


def _check_layout(path: Path, infos: list, *, data_size: int, file_size: int, data_start: int) -> None:
    """Tensors must tile the data section from 0 without overlaps or holes, and fit inside the file."""
    cursor = 0
    for begin, end, info in infos:
        if begin < cursor:
            raise _bad(path, f"header lies about offsets: [{begin}, {end}] overlaps the previous tensor",
                       tensor=info.name)
        if begin > cursor:
            raise _bad(path, f"header lies about offsets: hole of {begin - cursor} bytes before it", tensor=info.name)
        cursor = end
    if cursor > data_size:
        raise _bad(path, f"truncated: expected {data_start + cursor} bytes, file has {file_size}")
    if cursor < data_size:
        # The safetensors library refuses such a file ("file not fully covered"): refuse it here, not at load time.
        raise _bad(path, f"{data_size - cursor} bytes after the last tensor (expected {data_start + cursor} bytes, "
                         f"file has {file_size})")


def _check_metadata(path: Path, metadata: object) -> None:
    ok = isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    if not ok:
        raise _bad(path, "__metadata__ must map strings to strings")


def _not_json(name: str) -> object:
    """NaN / Infinity / -Infinity parse in Python but are not JSON: the safetensors library refuses them."""
    raise ValueError(f"{name} is not a JSON value")


def _is_uint(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _bad(path: Path, what: str, *, tensor: str | None = None) -> CheckpointError:
    where = f"{path}, tensor {tensor}" if tensor else str(path)
    return CheckpointError(
        f"invalid safetensors file: {what}",
        where=where,
        fix="re-download or re-export the checkpoint (e.g. save_pretrained(..., safe_serialization=True))",
    )
