"""Fuzz read_safetensors_header: arbitrary bytes, arbitrary JSON headers and mutated valid files either parse or
raise CheckpointError (one line); anything it accepts, the safetensors library reads the same way."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from neuronpack.checkpoint.safetensors_header import DTYPE_BITS, read_safetensors_header
from neuronpack.errors import CheckpointError

from . import assert_one_line, fuzz_settings

# Dtypes numpy can hold, so the safetensors library can be the reference for files we accept.
LIB_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "I32": 4, "U32": 4, "F32": 4,
              "I64": 8, "U64": 8, "F64": 8}

json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
                | st.text(max_size=8))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
tensor_specs = st.lists(
    st.tuples(st.text(min_size=1, max_size=10).filter(lambda n: n != "__metadata__"),
              st.sampled_from(sorted(LIB_DTYPES)), st.lists(st.integers(0, 4), max_size=3)),
    min_size=1, max_size=5, unique_by=lambda t: t[0],
)


def frame(raw: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(raw)) + raw + data


def valid_file(specs) -> tuple[dict, bytes]:
    """A well-formed header and data section for [(name, dtype, shape)]."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in specs:
        n = LIB_DTYPES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    return header, bytes(offset)


def parse(path: Path, blob: bytes):
    path.write_bytes(blob)
    try:
        return read_safetensors_header(path)
    except CheckpointError as exc:
        assert_one_line(exc)
        assert str(path) in exc.where
        return None


@fuzz_settings(300)
@given(blob=st.binary(max_size=200))
@example(blob=frame(b"[" * 100_000))  # regression: RecursionError escaped from json.loads
def test_arbitrary_bytes(tmp_path, blob):
    parse(tmp_path / "f.safetensors", blob)


@fuzz_settings(300)
@given(header=json_values, data=st.binary(max_size=64))
@example(header={"a": {"dtype": [], "shape": [1], "data_offsets": [0, 4]}}, data=bytes(4))  # regression: TypeError
@example(header={"a": {"dtype": {}, "shape": [1], "data_offsets": [0, 4]}}, data=bytes(4))  # regression: TypeError
def test_arbitrary_json_header(tmp_path, header, data):
    parse(tmp_path / "f.safetensors", frame(json.dumps(header).encode(), data))


MUTATIONS = ("set-field", "drop-field", "truncate", "extend", "flip-byte", "length-prefix", "metadata")


@fuzz_settings(400)
@given(specs=tensor_specs, mutation=st.sampled_from(MUTATIONS), value=json_values, pick=st.integers(0, 2**16),
       field=st.sampled_from(["dtype", "shape", "data_offsets", "extra"]))
def test_mutated_valid_files(tmp_path, specs, mutation, value, pick, field):
    header, data = valid_file(specs)
    names = [n for n, _d, _s in specs]
    name = names[pick % len(names)]
    if mutation == "set-field":
        header[name][field] = value
    elif mutation == "drop-field":
        header[name].pop(field, None)
    elif mutation == "metadata":
        header["__metadata__"] = value
    raw = json.dumps(header).encode()
    blob = frame(raw, data)
    if mutation == "truncate":
        blob = blob[: pick % (len(blob) + 1)]
    elif mutation == "extend":
        blob += bytes(1 + pick % 7)
    elif mutation == "flip-byte":
        i = pick % len(blob)
        blob = blob[:i] + bytes([blob[i] ^ (1 + pick % 255)]) + blob[i + 1 :]
    elif mutation == "length-prefix":
        blob = struct.pack("<Q", pick * 977) + blob[8:]
    path = tmp_path / "f.safetensors"
    infos = parse(path, blob)
    if infos is not None:
        _agrees_with_library(path, infos)


@fuzz_settings(150)
@given(specs=tensor_specs)
def test_valid_files_parse_like_the_library(tmp_path, specs):
    header, data = valid_file(specs)
    path = tmp_path / "f.safetensors"
    infos = parse(path, frame(json.dumps(header).encode(), data))
    assert infos is not None and set(infos) == {n for n, _d, _s in specs}
    _agrees_with_library(path, infos)


def _agrees_with_library(path: Path, infos) -> None:
    """What we accept, the safetensors library reads with the same dtypes and shapes (numpy-typed dtypes only)."""
    if not all(i.dtype in LIB_DTYPES for i in infos.values()):
        return
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        assert set(f.keys()) == set(infos)
        for name in f.keys():
            sl = f.get_slice(name)
            assert sl.get_dtype() == infos[name].dtype and tuple(sl.get_shape()) == infos[name].shape


@pytest.mark.parametrize("dtype", sorted(DTYPE_BITS))
def test_every_dtype_name_is_known(tmp_path, dtype):
    """Sanity for the table the fuzzers lean on: a zero-element tensor of each dtype parses."""
    header = {"t": {"dtype": dtype, "shape": [0], "data_offsets": [0, 0]}}
    assert parse(tmp_path / "f.safetensors", frame(json.dumps(header).encode()))["t"].nbytes == 0


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (frame(b"[" * 100_000), "nested too deeply"),  # was RecursionError
        (frame(json.dumps({"a": {"dtype": [], "shape": [1], "data_offsets": [0, 4]}}).encode(), bytes(4)),
         "unknown dtype []"),  # was TypeError: unhashable type: 'list'
        (frame(json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode(), bytes(5)),
         "1 bytes after the last tensor"),  # was accepted; the safetensors library then refused the file
        (frame(b'{"a\\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', bytes(4)),
         "not valid UTF-8"),  # was accepted; the safetensors library refused it ("unexpected end of hex escape")
        (frame(b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": Infinity}}', bytes(4)),
         "Infinity is not a JSON value"),  # was accepted; the library refused it ("expected value")
    ],
    ids=["deep-nesting", "unhashable-dtype", "trailing-bytes", "lone-surrogate", "infinity-constant"],
)
def test_regressions_found_by_fuzzing(tmp_path, blob, message):
    path = tmp_path / "f.safetensors"
    path.write_bytes(blob)
    with pytest.raises(CheckpointError) as info:
        read_safetensors_header(path)
    assert message in info.value.what
    assert_one_line(info.value)
