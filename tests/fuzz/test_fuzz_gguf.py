"""Fuzz GGUF import with tiny GGUF files (tests/checkpoint/tiny_gguf.py) that are broken in generated ways: truncated,
bytes flipped or integers overwritten in the header / metadata / tensor-info region, and metadata that disagrees
with the tensors (head counts, layer count, vocabulary, context length). import_gguf either writes a checkpoint that
opens, or raises a NeuronpackError (one line) and leaves no output and no staging directory behind."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from neuronpack.checkpoint import import_gguf, open_checkpoint
from neuronpack.checkpoint.gguf_import import gguf_auto_dtype
from neuronpack.errors import NeuronpackError
from tests.checkpoint.tiny_gguf import write_tiny_gguf

from . import assert_one_line, fuzz_settings


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, tiny_llama) -> tuple[bytes, int]:
    """(bytes of a valid tiny F32 llama GGUF, offset where its tensor data starts)."""
    from gguf import GGUFReader

    path = write_tiny_gguf(tiny_llama, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return path.read_bytes(), int(GGUFReader(path).data_offset)


def mutate(blob: bytes, kind: str, where: int, value: int) -> bytes:
    if kind == "truncate":
        return blob[:where]
    if kind == "flip":
        return blob[:where] + bytes([blob[where] ^ (1 + value % 255)]) + blob[where + 1:]
    if kind == "u64":  # lengths and counts in GGUF are little-endian u64: overwrite one with a random value
        return blob[:where] + struct.pack("<Q", value) + blob[where + 8:]
    return blob[:where] + struct.pack("<I", value & 0xFFFFFFFF) + blob[where + 4:]  # "u32": types, dims, enums


def import_or_refuse(path: Path, out: Path) -> Path | None:
    try:
        result = import_gguf(path, out)
    except NeuronpackError as exc:
        assert_one_line(exc)
        assert not out.exists()
        assert not [p for p in out.parent.iterdir() if p.name.startswith(".neuronpack-staging")]
        return None
    open_checkpoint(result)
    shutil.rmtree(result)
    return result


@fuzz_settings(300)
@given(kind=st.sampled_from(["truncate", "flip", "u64", "u32"]), pos=st.integers(0, 2**31),
       value=st.integers(0, 2**64 - 1))
def test_header_mutations_parse_or_refuse(tmp_path, tiny_gguf, kind, pos, value):
    """The parse step alone (cheap): gguf_auto_dtype raises CheckpointError for anything gguf-py cannot read."""
    blob, data_offset = tiny_gguf
    path = tmp_path / "m.gguf"
    path.write_bytes(mutate(blob, kind, pos % data_offset, value))
    try:
        assert gguf_auto_dtype(path) in ("float32", "float16", "bfloat16")
    except NeuronpackError as exc:
        assert_one_line(exc)


@fuzz_settings(30)
@given(kind=st.sampled_from(["truncate", "flip", "u64", "u32"]), pos=st.integers(0, 2**31),
       value=st.integers(0, 2**64 - 1))
def test_mutated_files_import_or_refuse(tmp_path, tiny_gguf, kind, pos, value):
    blob, data_offset = tiny_gguf
    # Mostly the header/metadata/tensor-info region; sometimes the data region (truncation there is a corrupt file).
    where = pos % (data_offset if pos % 4 else len(blob))
    path = tmp_path / "m.gguf"
    path.write_bytes(mutate(blob, kind, where, value))
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    import_or_refuse(path, out)


CONFIG_FIELDS = {
    "num_attention_heads": st.sampled_from([1, 2, 3, 8, 64]),
    "num_key_value_heads": st.sampled_from([1, 3, 4, 16]),
    "num_hidden_layers": st.sampled_from([1, 3, 7]),
    "vocab_size": st.sampled_from([1, 10, 100_000]),
    "max_position_embeddings": st.sampled_from([1, 7, 2**20]),
    "hidden_size": st.sampled_from([8, 32, 96]),
    "intermediate_size": st.sampled_from([1, 50]),
    "rms_norm_eps": st.sampled_from([0.0, 1e30]),
    "bos_token_id": st.sampled_from([0, 10**6]),
    "eos_token_id": st.sampled_from([0, 10**6]),
}


@fuzz_settings(12)
@given(changes=st.dictionaries(st.sampled_from(sorted(CONFIG_FIELDS)), st.integers(0, 10**6), min_size=1, max_size=3),
       data=st.data())
def test_metadata_disagreeing_with_tensors(tmp_path, tiny_llama, changes, data):
    """GGUF metadata written from a config.json that lies about the tensors' shapes."""
    copy = tmp_path / "src"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(tiny_llama, copy)
    config = json.loads((copy / "config.json").read_text())
    for key in changes:
        config[key] = data.draw(CONFIG_FIELDS[key], label=key)
    (copy / "config.json").write_text(json.dumps(config))
    gguf_path = tmp_path / "m.gguf"
    try:
        write_tiny_gguf(copy, gguf_path)
    except Exception:  # noqa: BLE001 - the test writer itself cannot express this combination
        assume(False)
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    import_or_refuse(gguf_path, out)


def test_bos_token_outside_the_vocabulary_is_refused(tmp_path, tiny_llama):
    """Regression (found by the fuzzer): transformers raised IndexError from its GGUF tokenizer mapping and it escaped
    as a traceback; now a CheckpointError naming the exception."""
    gguf_path = _gguf_with_config(tmp_path, tiny_llama, bos_token_id=10**6)
    with pytest.raises(NeuronpackError, match="transformers cannot load this GGUF .IndexError") as info:
        import_gguf(gguf_path, tmp_path / "out")
    assert_one_line(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field, value", [("hidden_size", 10**6), ("intermediate_size", 10**9),
                                          ("num_hidden_layers", 10**6), ("max_position_embeddings", 2**30)])
def test_a_header_declaring_a_far_larger_model_is_refused_before_loading(tmp_path, tiny_llama, field, value):
    """Regression (two CI runs were OOM-killed at 24 GB inside the GGUF fuzz test): transformers allocates the model a
    header declares before it notices the tensors do not fit, so a corrupt size field could ask for terabytes. The
    header is now checked against the tensors the file holds first."""
    gguf_path = _gguf_with_config(tmp_path, tiny_llama, **{field: value})
    with pytest.raises(NeuronpackError, match="declares a larger model than the file holds") as info:
        import_gguf(gguf_path, tmp_path / "out")
    assert_one_line(info.value)
    assert not (tmp_path / "out").exists()


def _gguf_with_config(tmp_path: Path, tiny_llama: Path, **changes) -> Path:
    """A tiny GGUF whose metadata is written from tiny_llama's config.json with ``changes`` applied."""
    copy = tmp_path / "src"
    shutil.copytree(tiny_llama, copy)
    config = {**json.loads((copy / "config.json").read_text()), **changes}
    (copy / "config.json").write_text(json.dumps(config))
    return write_tiny_gguf(copy, tmp_path / "m.gguf")
