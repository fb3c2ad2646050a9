"""runtime/launch.py: which serve options each kind of artifact refuses, and a torch artifact's engine + app built
from options (what `neuronpack serve` reports, served on loopback to the openai client). The command itself is
tests/cli/test_serve_cmd.py's; the vLLM launches are tests/backends/vllm/ and tests/backends/vneuron/'s."""

from __future__ import annotations

import openai
import pytest

from neuronpack.errors import ServeError
from neuronpack.progress import NullReporter
from neuronpack.runtime.launch import (
    RequestLogOptions,
    ServeLimits,
    ServeOptions,
    TorchLaunch,
    refuse_options,
    serve_launch,
)
from tests.runtime.serving import LiveServer

REFUSED = [  # (framework, options, what the one line names)
    ("torch", ServeOptions(weights="/models/llama"), "--weights applies to vneuron artifacts"),
    ("nxd", ServeOptions(weights="/models/llama"), "--weights applies to vneuron artifacts"),
    ("torch", ServeOptions(tool_call_parser="mistral"), "harmony ones: vLLM's openai), not 'mistral'"),
    ("torch", ServeOptions(reasoning_parser="qwen4"), "reasoning parser 'qwen4' not found. Available parsers: "
                                                      "cohere_command3, cohere_command4, deepseek_r1"),
    ("torch", ServeOptions(reasoning_parser="granite"), "the built-in server implements qwen3, mimo, deepseek_r1, "
                                                        "openai_gptoss only"),
    ("nxd", ServeOptions(reasoning_parser="qwen3"), "served by vLLM"),
    ("nxd", ServeOptions(limits=ServeLimits(prefix_caching=False)), "set the built-in runtime's prefix cache"),
    ("tnx", ServeOptions(limits=ServeLimits(prefix_cache_memory=64)), "set the built-in runtime's prefix cache"),
    ("vneuron", ServeOptions(limits=ServeLimits(max_num_batched_tokens=16)), "sets the built-in runtime's scheduling"),
    ("vneuron", ServeOptions(vllm_target="vllm-neuron"), "served by the SDK 2.31+ vLLM Neuron plugin only"),
]
TAKEN = [
    ("torch", ServeOptions(reasoning_parser="deepseek_r1")),
    ("torch", ServeOptions(tool_call_parser="hermes", threads=1, limits=ServeLimits(prefix_caching=False,
                                                                                   max_num_batched_tokens=16))),
    ("nxd", ServeOptions(tool_call_parser="hermes3", vllm_target="vllm-v0", structured_outputs=True)),
    ("vneuron", ServeOptions(weights="/models/llama", tool_call_parser="hermes")),
]


@pytest.mark.parametrize(("framework", "options", "message"), REFUSED)
def test_an_option_another_server_would_ignore_is_refused(framework, options, message):
    with pytest.raises(ServeError) as err:
        refuse_options(framework, options, where="/art/3f2a")
    assert message in str(err.value) and err.value.fix


@pytest.mark.parametrize(("framework", "options"), TAKEN)
def test_options_of_the_artifacts_own_server_are_taken(framework, options):
    refuse_options(framework, options, where="/art/3f2a")  # the server itself checks their values


@pytest.fixture
def _process_settings():
    """build() sets torch's threads and glibc's arenas for the whole process, as serve does: put them back."""
    import torch

    from neuronpack.runtime.openai.memory import limit_malloc_arenas

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    limit_malloc_arenas(8)  # as tests/runtime/openai/test_memory.py leaves it


def test_a_torch_artifact_is_built_reported_and_served(serve_artifact, tiny_llama, _process_settings):
    from neuronpack.artifacts.manifest import read_manifest
    from neuronpack.runtime.loader import available_cores
    from tests.runtime.serving import hf_greedy

    launch = serve_launch(serve_artifact, read_manifest(serve_artifact), ServeOptions(served_model_name="tiny"))
    assert isinstance(launch, TorchLaunch) and launch.prepare() is None and launch.notes == []
    reporter = NullReporter()
    served = launch.build(reporter)
    engine, summary = served.loaded.engine, served.summary
    assert summary == engine.summary()
    assert (summary.batch_size, summary.max_model_len, summary.threads) == (
        engine.model.batch_size, engine.max_model_len, available_cores())
    assert summary.prefix_caching_off is None and summary.cache_blocks == engine.scheduler.rows.cache_blocks > 0
    assert summary.block_bytes == 16 * engine.model.kv_token_bytes
    loaded_line = reporter.messages[-3]
    assert loaded_line.startswith("loaded tiny in ") and f"(batch {summary.batch_size}, " in loaded_line
    assert reporter.messages[-2] == (f"prefix caching: {summary.cache_blocks} blocks of 16 tokens "
                                     f"({summary.cache_blocks * 16} tokens, {summary.cache_mib:.1f} MiB) beyond the "
                                     "batch, whose free rows keep prefixes too")
    assert reporter.messages[-1] == summary.chunked_prefill_line() and "1.5 decode steps" in reporter.messages[-1]
    tok = engine.tokenizer
    with LiveServer(served.app) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none")
        assert [m.id for m in client.models.list().data] == ["tiny"]
        done = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=8, temperature=0)
    expected = hf_greedy(tiny_llama, tok.encode("The quick brown fox"), 8)
    assert done.choices[0].text == tok.decode(expected) and done.usage.completion_tokens == len(expected)


def test_prefix_caching_turned_off_is_reported_with_its_reason(serve_artifact, _process_settings):
    from neuronpack.artifacts.manifest import read_manifest

    options = ServeOptions(threads=1, limits=ServeLimits(prefix_caching=False))
    reporter = NullReporter()
    served = serve_launch(serve_artifact, read_manifest(serve_artifact), options).build(reporter)
    assert served.summary.cache_blocks == 0 and served.summary.threads == 1
    assert reporter.messages[-2] == f"prefix caching off: {served.summary.prefix_caching_off}"
    assert "turned off" in served.summary.prefix_caching_off


def test_the_request_log_is_checked_before_loading_and_reported(serve_artifact, tmp_path, _process_settings):
    from neuronpack.artifacts.manifest import read_manifest

    manifest = read_manifest(serve_artifact)
    bad = serve_launch(serve_artifact, manifest, ServeOptions(request_log=RequestLogOptions(tmp_path / "no" / "r")))
    with pytest.raises(ServeError, match="directory does not exist"):
        bad.prepare()
    log = tmp_path / "requests.jsonl"
    options = ServeOptions(threads=1, request_log=RequestLogOptions(log, max_mib=0.5, backups=2, prompts=True))
    launch = serve_launch(serve_artifact, manifest, options)
    assert launch.prepare() is None and launch.printed()[0]["argv"][-7:] == [
        "--request-log", str(log), "--request-log-max-mib", "0.5", "--request-log-backups", "2",
        "--request-log-prompts"]
    reporter = NullReporter()
    served = launch.build(reporter)
    assert f"request log: {log} (rotated at 0.5 MiB, 2 kept; with the prompts)" in reporter.messages
    with LiveServer(served.app) as live:
        openai.OpenAI(base_url=f"{live.url}/v1", api_key="none").completions.create(
            model=served.loaded.served_model_name, prompt="Hello", max_tokens=2)
    assert '"prompt": "Hello"' in log.read_text()
