"""read_safetensors_header: agrees with the safetensors library on real files and refuses lying/truncated ones."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from neuronpack.checkpoint import read_safetensors_header
from neuronpack.checkpoint.safetensors_header import expected_nbytes, read_safetensors_metadata
from neuronpack.errors import CheckpointError
from tests.helpers.fresh_interpreter import run_fresh


def write_raw(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_matches_safetensors_library(tmp_path):
    tensors = {
        "a.weight": torch.randn(5, 3),
        "b.bias": torch.randn(7).to(torch.bfloat16),
        "c.q": torch.randint(-128, 127, (4, 2), dtype=torch.int8),
        "d.mask": torch.tensor([True, False]),
        "e.f8": torch.randn(3, 2).to(torch.float8_e4m3fn),
        "f.scalar": torch.tensor(3, dtype=torch.int64),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    infos = read_safetensors_header(path)
    assert set(infos) == set(tensors)
    with safe_open(path, framework="pt") as f:
        for name in f.keys():
            sl = f.get_slice(name)
            assert infos[name].dtype == sl.get_dtype()
            assert list(infos[name].shape) == sl.get_shape()
            assert infos[name].nbytes == tensors[name].numel() * tensors[name].element_size()
            assert infos[name].file == path
    assert infos["e.f8"].dtype == "F8_E4M3" and infos["f.scalar"].shape == ()
    assert read_safetensors_metadata(path) == {"format": "pt"}


def test_truncated_file_names_expected_and_actual_size(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(64, 64)}, path)
    full = path.read_bytes()
    path.write_bytes(full[:-100])
    with pytest.raises(CheckpointError) as err:
        read_safetensors_header(path)
    assert f"truncated: expected {len(full)} bytes, file has {len(full) - 100}" in err.value.what
    assert str(path) in err.value.where


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}}, b"\0" * 16, "header lies about offsets"),
        (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
            b"\0" * 12,
            "overlaps",
        ),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16, "hole"),
        ({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}}, b"\0", "unknown dtype"),
        ({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, "shape"),
        ({"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, "data_offsets"),
        ({"__metadata__": {"format": 1}}, b"", "__metadata__"),
    ],
)
def test_lying_headers_are_refused_naming_the_tensor(tmp_path, header, data, message):
    path = write_raw(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(CheckpointError) as err:
        read_safetensors_header(path)
    assert message in err.value.what
    assert str(path) in err.value.where


def test_short_file_insane_length_and_bad_json(tmp_path):
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\1\2\3")
    with pytest.raises(CheckpointError, match="at least 8 bytes"):
        read_safetensors_header(short)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(CheckpointError, match="not sane"):
        read_safetensors_header(huge)
    beyond = tmp_path / "beyond.safetensors"
    beyond.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(CheckpointError, match="truncated"):
        read_safetensors_header(beyond)
    notjson = tmp_path / "notjson.safetensors"
    notjson.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_safetensors_header(notjson)
    with pytest.raises(CheckpointError, match="cannot read"):
        read_safetensors_header(tmp_path / "missing.safetensors")


def test_expected_nbytes():
    assert expected_nbytes("BF16", (4, 3)) == 24
    assert expected_nbytes("F4", (4,)) == 2
    assert expected_nbytes("I64", ()) == 8


def test_header_path_does_not_import_torch(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(2, 2)}, path)
    code = (
        "from pathlib import Path; from neuronpack.checkpoint import read_safetensors_header;"
        f"info = read_safetensors_header(Path({str(path)!r}));"
        "assert info['w'].shape == (2, 2)"
    )
    _, torch_imported = run_fresh(code)
    assert not torch_imported
