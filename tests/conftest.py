from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.tiny_models import make_tiny_checkpoint


@pytest.fixture(scope="session", autouse=True)
def _isolated_session_cache(tmp_path_factory):
    """The same cache directory for session fixtures (they are set up before any function fixture): a session-wide
    build must not write its digests and remembered recipes into the user's ~/.cache either."""
    patch = pytest.MonkeyPatch()
    patch.setenv("NEURONPACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "np-cache"))
    yield
    patch.undo()


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


@pytest.fixture(scope="session")
def lora_artifact(tmp_path_factory, tiny_llama):
    """One AOTInductor artifact of the tiny serving recipe with two PEFT adapters ("sql": rank 8 on q/k/v/o; "chat":
    rank 4 rsLoRA on v/o/up of layer 1), compiled through the pipeline; shared by every LoRA test.
    Returns (artifact dir, {adapter name: adapter dir})."""
    from tests.helpers.lora_adapters import make_peft_adapter
    from tests.runtime.serving import build_artifact

    root = tmp_path_factory.mktemp("lora-artifact")
    adapters = {
        "sql": make_peft_adapter(tiny_llama, root / "adapters" / "sql", rank=8, alpha=16, seed=1),
        "chat": make_peft_adapter(tiny_llama, root / "adapters" / "chat", rank=4, alpha=8, seed=2, use_rslora=True,
                                  target_modules=("v_proj", "o_proj", "up_proj"), layers=[1]),
    }
    lora = ('lora.adapters=[' + ", ".join(f'{{name="{n}", path="{p}"}}' for n, p in adapters.items()) + "]")
    overrides = ["compiler=aoti", lora, "lora.max_rank=8", "lora.max_loras=2",
                 'lora.target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"]']
    return build_artifact(tiny_llama, root / "root", overrides), adapters


@pytest.fixture(scope="session")
def family_artifact(tmp_path_factory):
    """name -> FamilyArtifact: the new families' tiny checkpoints compiled once per session on first use
    (tests/helpers/family_artifacts.py: "qwen3", "qwen3-tied", "gemma3")."""
    from tests.helpers.family_artifacts import build_family_artifact

    built = {}

    def get(name: str):
        if name not in built:
            built[name] = build_family_artifact(name, tmp_path_factory.mktemp(f"family-{name}"))
        return built[name]

    return get
