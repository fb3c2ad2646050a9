"""resolve_model: local dirs as-is, .gguf refused with the command to run, hub ids through the offline cache."""

from __future__ import annotations

import shutil

import pytest

from neuronpack.checkpoint import open_checkpoint, resolve_model
from neuronpack.errors import CheckpointError, ModelNotFoundError

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(cache, repo_id, source, *, revision="main"):
    """Lay out a model in the Hugging Face cache format, as `hf download` leaves it."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(source, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / revision).write_text(COMMIT)
    return snapshot


def test_local_dir_is_returned_absolute(tiny_llama, monkeypatch):
    monkeypatch.chdir(tiny_llama.parent)
    assert resolve_model(tiny_llama.name) == tiny_llama.absolute()
    assert resolve_model(tiny_llama) == tiny_llama.absolute()


def test_gguf_file_points_to_import_gguf(tmp_path):
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    for source in (gguf, "missing/model.gguf"):
        with pytest.raises(CheckpointError) as err:
            resolve_model(source)
        assert "neuronpack import-gguf" in err.value.fix and "--out" in err.value.fix


def test_offline_and_not_cached_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("someorg/some-model@v1")
    assert "not in the local Hugging Face cache" in err.value.what
    assert err.value.where == "someorg/some-model@v1"
    assert "local" in err.value.fix and "download" in err.value.fix


def test_offline_cached_snapshot_resolves(tmp_path, tiny_llama, monkeypatch):
    cache = tmp_path / "hub"
    snapshot = fake_hub_cache(cache, "tiny-org/tiny-llama", tiny_llama)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    resolved = resolve_model("tiny-org/tiny-llama")
    assert resolved == snapshot.absolute()
    assert open_checkpoint(resolved).config["model_type"] == "llama"
    assert resolve_model(f"tiny-org/tiny-llama@{COMMIT}") == snapshot.absolute()


def test_path_like_strings_that_do_not_exist(tmp_path):
    for source in (str(tmp_path / "nope"), "./nope", "a/b/c"):
        with pytest.raises(ModelNotFoundError, match="no such local directory"):
            resolve_model(source)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CheckpointError, match="is a file"):
        resolve_model(tmp_path / "file.txt")


def test_unreachable_hub_is_a_clear_error(tmp_path, monkeypatch):
    """Online mode against a closed loopback port: the same one-line error, never a traceback."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("someorg/some-model")
    assert "unreachable" in err.value.what or "could not download" in err.value.what
    assert "hf download someorg/some-model" in err.value.fix
