from pathlib import Path

import pytest

from tests.runtime.serving import EXPORT, build_artifact


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    """The tiny test tokenizer (byte-level BPE + ChatML template) saved as transformers would ship it."""
    from tests.helpers.tiny_models import make_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    make_tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def serve_artifact(tmp_path_factory, tiny_llama) -> Path:
    """The tiny serving artifact (export-only graphs), shared by the runtime and serve CLI tests."""
    return build_artifact(tiny_llama, tmp_path_factory.getbasetemp() / "serve-root")


@pytest.fixture(scope="session")
def compiled_lm(serve_artifact):
    from neuronpack.backends.torch_aot import load_artifact

    return load_artifact(serve_artifact)


@pytest.fixture(scope="session")
def artifact_tokenizer(serve_artifact):
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    return ArtifactTokenizer.from_dir(serve_artifact)


SPECULATION = ['speculation.kind="prompt_lookup"', "speculation.length=3", "speculation.prompt_lookup_min=1",
               "speculation.prompt_lookup_max=3"]


@pytest.fixture(scope="session")
def spec_artifact(tmp_path_factory, tiny_llama) -> Path:
    """The tiny serving artifact compiled with prompt-lookup speculation (k = 3: verify graphs of 1..4 tokens)."""
    return build_artifact(tiny_llama, tmp_path_factory.getbasetemp() / "spec-root", [*EXPORT, *SPECULATION])


@pytest.fixture(scope="session")
def spec_lm(spec_artifact):
    from neuronpack.backends.torch_aot import load_artifact

    return load_artifact(spec_artifact)


@pytest.fixture(scope="session")
def spec_tokenizer(spec_artifact):
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    return ArtifactTokenizer.from_dir(spec_artifact)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One intra-op thread: the engine thread, the HTTP loop and the client share 2 cores in CI, and OpenMP threads
    that spin while another thread holds the core make a 6 ms decode step take 100+ ms."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def lora_live(lora_artifact):
    """The LoRA artifact served on loopback (base model "tiny", each adapter under its own name)."""
    from tests.runtime.serving import lora_server

    with lora_server(lora_artifact[0], "tiny") as live:
        yield live


@pytest.fixture(scope="module")
def lora_client(lora_live):
    import openai

    return openai.OpenAI(base_url=f"{lora_live.url}/v1", api_key="unused", max_retries=0, timeout=120)
