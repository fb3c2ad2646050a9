"""write_safetensors_sharded: streams row chunks into files safetensors and transformers load bit-exactly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from neuronpack.checkpoint import TensorSpec, read_safetensors_header, write_safetensors_sharded
from neuronpack.progress import NullReporter


def row_chunks(name, tensor, rows):
    for start in range(0, max(tensor.shape[0], 1), rows):
        yield name, tensor[start:start + rows]


def load_all(paths):
    out = {}
    for path in paths:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                out[name] = f.get_tensor(name)
    return out


TENSORS = {
    "embed.weight": torch.randn(37, 16),
    "layer.q": torch.randint(-128, 127, (33, 16), dtype=torch.int8),
    "layer.scale": torch.rand(33, 1),
    "norm.weight": torch.randn(16).to(torch.bfloat16),
    "fp8.weight": torch.randn(9, 4).to(torch.float8_e4m3fn),
    "d2t": torch.arange(5, dtype=torch.int64),
    "t2d": torch.tensor([True, False, True]),
    "empty": torch.zeros(0, 4),
}


def specs_of(tensors):
    return [TensorSpec(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()]


def all_chunks(tensors, rows=8):
    for name, tensor in tensors.items():
        if tensor.dim() == 0 or tensor.shape[0] == 0:
            yield name, tensor
        else:
            yield from row_chunks(name, tensor, rows)


def test_single_file_round_trip_in_row_chunks(tmp_path):
    paths = write_safetensors_sharded(tmp_path, specs_of(TENSORS), all_chunks(TENSORS), metadata={"by": "test"})
    assert paths == [tmp_path / "model.safetensors"]
    assert not (tmp_path / "model.safetensors.index.json").exists()
    loaded = load_all(paths)
    assert set(loaded) == set(TENSORS)
    for name, tensor in TENSORS.items():
        assert loaded[name].dtype == tensor.dtype
        assert torch.equal(loaded[name].view(torch.uint8), tensor.view(torch.uint8)), name
    with safe_open(paths[0], framework="pt") as f:
        assert f.metadata() == {"format": "pt", "by": "test"}
    read_safetensors_header(paths[0])  # our own validator accepts it too


def test_sharded_layout_and_index_like_transformers(tmp_path):
    specs = specs_of(TENSORS)
    paths = write_safetensors_sharded(tmp_path, specs, all_chunks(TENSORS), max_shard_bytes=1500)
    n = len(paths)
    assert n > 1
    assert [p.name for p in paths] == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    total = sum(t.numel() * t.element_size() for t in TENSORS.values())
    assert index["metadata"]["total_size"] == total
    assert set(index["weight_map"]) == set(TENSORS)
    loaded = load_all(paths)
    for name, tensor in TENSORS.items():
        assert torch.equal(loaded[name].view(torch.uint8), tensor.view(torch.uint8))
        with safe_open(tmp_path / index["weight_map"][name], framework="pt") as f:
            assert name in f.keys()
    # Each shard stays within the budget unless a single tensor is larger than it.
    for path in paths:
        infos = read_safetensors_header(path)
        assert sum(i.nbytes for i in infos.values()) <= 1500 or len(infos) == 1


def test_transformers_loads_streamed_sharded_checkpoint(tmp_path, tiny_llama):
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama)
    state = {k: v for k, v in ref.state_dict().items() if k != "lm_head.weight" or not ref.config.tie_word_embeddings}
    out = tmp_path / "out"
    out.mkdir()
    write_safetensors_sharded(out, specs_of(state), all_chunks(state, rows=16), max_shard_bytes=40_000)
    (out / "config.json").write_text((tiny_llama / "config.json").read_text())
    assert (out / "model.safetensors.index.json").exists()
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=0, atol=0)


def test_memory_stays_about_one_chunk(tmp_path):
    """The writer must not accumulate: chunks are freed as soon as they are on disk."""
    import weakref

    alive = []

    def chunks():
        for i in range(8):
            t = torch.full((64, 1024), float(i))
            alive.append(weakref.ref(t))
            yield "big", t
            # By the time the next chunk is requested, at most the current one may still be referenced by us.
            assert sum(r() is not None for r in alive[:-1]) == 0

    write_safetensors_sharded(tmp_path, [TensorSpec("big", torch.float32, (512, 1024))], chunks())
    with safe_open(tmp_path / "model.safetensors", framework="pt") as f:
        assert f.get_slice("big")[64 * 7:64 * 7 + 1][0, 0].item() == 7.0


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([("a", torch.zeros(4, 2, dtype=torch.float16))], "dtype"),
        ([("a", torch.zeros(3, 2))], "chunks ended inside 'a'"),
        ([("a", torch.zeros(3, 2)), ("a", torch.zeros(2, 2))], "more than"),
        ([("a", torch.zeros(4, 2)), ("a", torch.zeros(1, 2))], "after every spec"),
        ([("b", torch.zeros(4, 2))], "expected a chunk of 'a'"),
        ([("a", torch.zeros(4, 3))], "does not stack"),
        ([("a", torch.zeros(4, 2)), ("zzz", torch.zeros(1))], "after every spec"),
    ],
)
def test_mismatched_chunks_raise_value_error(tmp_path, chunks, message):
    with pytest.raises(ValueError, match=message):
        write_safetensors_sharded(tmp_path, [TensorSpec("a", torch.float32, (4, 2))], iter(chunks))


def test_duplicate_specs_and_reporter(tmp_path):
    with pytest.raises(ValueError, match="twice"):
        write_safetensors_sharded(tmp_path, [TensorSpec("a", torch.float32, (1,))] * 2, iter([]))
    reporter = NullReporter()
    paths = write_safetensors_sharded(tmp_path, [], iter([]), reporter=reporter)
    assert read_safetensors_header(paths[0]) == {}


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_stored_tensors_are_copied_byte_for_byte(tmp_path, monkeypatch, kernel_copy):
    """A TensorInfo chunk copies the stored bytes (copy_file_range, or pread/pwrite where the kernel cannot): the
    file equals the one written from the same tensors, also next to streamed rows, raw-byte rows and str dtypes."""
    import errno
    import os

    source = {"a": torch.randn(5, 3), "b": torch.arange(7, dtype=torch.int64), "c": torch.randn(4, 2).bfloat16()}
    save_file(source, str(tmp_path / "src.safetensors"))
    stored = read_safetensors_header(tmp_path / "src.safetensors")
    if not kernel_copy:
        def refuse(*_args):
            raise OSError(errno.EXDEV, "cross-device")

        monkeypatch.setattr(os, "copy_file_range", refuse)
    specs = [TensorSpec("x", "F32", (5, 3)), TensorSpec("y", torch.float32, (6, 2)), TensorSpec("b", "I64", (7,)),
             TensorSpec("c", torch.bfloat16, (4, 2))]
    rows = torch.randn(6, 2)
    raw = rows[4:].numpy().tobytes()  # rows as raw bytes in the spec's dtype
    chunks = [("x", stored["a"]), ("y", rows[:4]), ("y", raw), ("b", stored["b"]), ("c", stored["c"])]
    (tmp_path / "copied").mkdir()
    (tmp_path / "streamed").mkdir()
    write_safetensors_sharded(tmp_path / "copied", specs, iter(chunks))
    plain = [("x", source["a"]), ("y", rows), ("b", source["b"]), ("c", source["c"])]
    write_safetensors_sharded(tmp_path / "streamed", specs, iter(plain))
    copied, streamed = (tmp_path / d / "model.safetensors" for d in ("copied", "streamed"))
    assert copied.read_bytes() == streamed.read_bytes()


def test_raw_chunks_may_be_views_of_one_reused_buffer(tmp_path):
    """The writer writes a chunk before it asks for the next: a producer may refill one buffer for every chunk."""
    rows = torch.randn(10, 4)
    buffer = bytearray(2 * 4 * 4)  # two rows

    def chunks():
        for start in range(0, 10, 2):
            buffer[:] = rows[start:start + 2].numpy().tobytes()
            yield "w", memoryview(buffer)

    for name, stream in (("reused", chunks()), ("tensor", iter([("w", rows)]))):
        (tmp_path / name).mkdir()
        write_safetensors_sharded(tmp_path / name, [TensorSpec("w", "F32", (10, 4))], stream)
    assert (tmp_path / "reused" / "model.safetensors").read_bytes() == \
        (tmp_path / "tensor" / "model.safetensors").read_bytes()


def test_a_stored_tensor_must_be_the_whole_spec(tmp_path):
    with pytest.raises(ValueError, match="not whole rows"):
        write_safetensors_sharded(tmp_path, [TensorSpec("a", "F32", (4, 2))], iter([("a", b"\0" * 12)]))
    save_file({"a": torch.zeros(4, 2)}, str(tmp_path / "src.safetensors"))
    stored = read_safetensors_header(tmp_path / "src.safetensors")["a"]
    for spec in (TensorSpec("a", torch.float16, (4, 2)), TensorSpec("a", torch.float32, (8, 2))):
        with pytest.raises(ValueError, match="is not the whole"):
            write_safetensors_sharded(tmp_path, [spec], iter([("a", stored)]))


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_flush_behind_writes_the_same_bytes_and_syncs_while_writing(tmp_path, monkeypatch, kernel_copy):
    """flush_behind (convert-eagle): kernel-side copies go in pieces, each counted towards a background fdatasync;
    the file is the same as without it."""
    import errno
    import os

    from neuronpack.checkpoint import writer
    from neuronpack.fsutil import FlushBehind

    synced = []
    monkeypatch.setattr(writer, "_FLUSH_PIECE", 16)
    monkeypatch.setattr(writer, "FlushBehind", lambda fh: FlushBehind(fh, every=1))
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real_fdatasync(fd)))
    if not kernel_copy:
        def refuse(*_args):
            raise OSError(errno.EXDEV, "cross-device")

        monkeypatch.setattr(os, "copy_file_range", refuse)
    source = {"a": torch.randn(50, 3), "c": torch.randn(40, 2).bfloat16()}
    save_file(source, str(tmp_path / "src.safetensors"))
    stored = read_safetensors_header(tmp_path / "src.safetensors")
    specs = [TensorSpec("a", "F32", (50, 3)), TensorSpec("y", torch.float32, (6, 2)), TensorSpec("c", "BF16", (40, 2))]
    rows = torch.randn(6, 2)
    for name, flush in (("behind", True), ("plain", False)):
        (tmp_path / name).mkdir()
        chunks = [("a", stored["a"]), ("y", rows[:3]), ("y", rows[3:]), ("c", stored["c"])]
        write_safetensors_sharded(tmp_path / name, specs, iter(chunks), flush_behind=flush)
    assert (tmp_path / "behind" / "model.safetensors").read_bytes() == \
        (tmp_path / "plain" / "model.safetensors").read_bytes()
    assert synced  # fdatasync ran while the file was written


def test_flush_behind_raises_a_background_writeback_error(tmp_path, monkeypatch):
    """A writeback error seen by the background fdatasync is not lost (a later fsync of a new descriptor would not
    report it): the write fails with it."""
    import errno
    import os

    from neuronpack.checkpoint import writer
    from neuronpack.fsutil import FlushBehind

    def broken(_fd):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fdatasync", broken)
    monkeypatch.setattr(writer, "_FLUSH_PIECE", 16)
    monkeypatch.setattr(writer, "FlushBehind", lambda fh: FlushBehind(fh, every=1))
    save_file({"w": torch.randn(8, 4)}, str(tmp_path / "src.safetensors"))
    stored = read_safetensors_header(tmp_path / "src.safetensors")["w"]
    (tmp_path / "out").mkdir()
    with pytest.raises(OSError, match="I/O error"):
        write_safetensors_sharded(tmp_path / "out", [TensorSpec("w", "F32", (8, 4))], iter([("w", stored)]),
                                  flush_behind=True)


def test_stored_copies_run_beside_the_writing_and_report_their_errors(tmp_path, monkeypatch):
    """Stored tensors are copied by a worker while later tensors are written (the caller's thread is not the one
    that copies), into their own places; a copy that fails (a source cut short after its header was read) fails
    the write with that error, and an error of the caller's own is the one raised (not hidden by the copies')."""
    import os
    import threading

    source = {"a": torch.randn(64, 8), "b": torch.randn(32, 8)}
    save_file(source, str(tmp_path / "src.safetensors"))
    stored = read_safetensors_header(tmp_path / "src.safetensors")
    threads = []
    real_copy = os.copy_file_range

    def copy_file_range(*args):
        threads.append(threading.current_thread())
        return real_copy(*args)

    monkeypatch.setattr(os, "copy_file_range", copy_file_range)
    rows = torch.randn(16, 8)
    specs = [TensorSpec("a", "F32", (64, 8)), TensorSpec("r", "F32", (16, 8)), TensorSpec("b", "F32", (32, 8))]
    (tmp_path / "out").mkdir()
    write_safetensors_sharded(tmp_path / "out", specs, iter([("a", stored["a"]), ("r", rows), ("b", stored["b"])]))
    assert threads and threading.main_thread() not in threads
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert torch.equal(written["a"], source["a"]) and torch.equal(written["r"], rows)
    assert torch.equal(written["b"], source["b"])

    short = tmp_path / "short.safetensors"
    short.write_bytes((tmp_path / "src.safetensors").read_bytes()[: stored["b"].offset + 100])
    cut = read_safetensors_header(tmp_path / "src.safetensors")["b"]._replace(file=short)
    with pytest.raises(ValueError, match="ends inside b"):
        write_safetensors_sharded(tmp_path / "out", specs, iter([("a", stored["a"]), ("r", rows), ("b", cut)]))

    def failing():
        yield "a", stored["a"]
        raise RuntimeError("producer failed")

    threads.clear()
    with pytest.raises(RuntimeError, match="producer failed"):
        write_safetensors_sharded(tmp_path / "out", specs, failing())
