from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tiny_models import make_tiny_checkpoint


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep digest caches and artifact roots out of the user's home."""
    monkeypatch.setenv("NEURONPACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "np-cache"))
    monkeypatch.delenv("NEURON_COMPILED_ARTIFACTS", raising=False)
    monkeypatch.delenv("NEURONPACK_FRAMEWORK", raising=False)
    monkeypatch.delenv("VLLM_NEURON_FRAMEWORK", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny random Llama checkpoint with tokenizer (session-wide; treat as read-only)."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "llama", arch="llama")


@pytest.fixture
def make_checkpoint(tmp_path):
    """Factory for per-test tiny checkpoints: make_checkpoint(arch="qwen2", dtype="bfloat16", max_shard_size="20KB")."""
    counter = iter(range(1000))

    def _make(arch: str = "llama", **kwargs) -> Path:
        return make_tiny_checkpoint(tmp_path / f"{arch}-{next(counter)}", arch=arch, **kwargs)

    return _make
