"""`neuronpack generate` and `neuronpack serve` through the real CLI (CliRunner, and one real server process)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from neuronpack.cli.app import app
from tests.backends.neuron_standin import fixtures as standin
from tests.runtime.serving import EXPORT, RECIPE, SERVE_OVERRIDES, build_artifact, hf_greedy, wait_for_health

runner = CliRunner(env={"COLUMNS": "120"})
nxd_sdk, sdk_path = standin.nxd_sdk, standin.sdk_path  # fixtures: the stand-in Neuron SDK (it cannot run here)
TINY_NXD = ["target.framework=nxd", "target.instance=inf2", "target.tp_degree=2", "target.batch_size=2",
            "target.seq_len=256", "target.max_context_length=128", "model.dtype=bfloat16", "name=tiny-nxd"]


@pytest.fixture(autouse=True, scope="module")
def _restore_torch_threads():
    """`--threads 1` sets torch's process-wide thread count inside this test process: put it back afterwards."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, tiny_llama) -> Path:
    # Same inputs and root as the runtime tests' artifact: a cache hit when they ran first.
    return build_artifact(tiny_llama, tmp_path_factory.getbasetemp() / "serve-root")


@pytest.fixture(scope="module")
def tokenizer(artifact):
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    return ArtifactTokenizer.from_dir(artifact)


def generate(artifact: Path, *args: str):
    return runner.invoke(app, ["generate", str(artifact), "--threads", "1", "--quiet", *args])


def test_generate_json_is_transformers_greedy(artifact, tokenizer, tiny_llama):
    result = generate(artifact, "--prompt", "The quick brown fox", "--max-tokens", "12", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    expected = hf_greedy(tiny_llama, tokenizer.encode("The quick brown fox"), 12)
    assert data["tokens"] == expected and data["text"] == tokenizer.decode(expected)
    assert data["finish_reason"] in ("stop", "length") and data["completion_tokens"] == len(expected)
    assert set(data["timings"]) >= {"load_s", "ttft_s", "total_s", "tokens_per_s"}


def test_generate_text_chat_and_sampling(artifact, tokenizer, tiny_llama):
    result = generate(artifact, "--prompt", "Hello", "--chat", "--max-tokens", "8")
    assert result.exit_code == 0, result.output
    ids = tokenizer.encode_chat([{"role": "user", "content": "Hello"}])
    assert result.stdout == tokenizer.decode(hf_greedy(tiny_llama, ids, 8)) + "\n"
    args = ["--prompt", "Hello", "--max-tokens", "10", "--temperature", "0.9", "--top-k", "20", "--seed", "5",
            "--format", "json"]
    first, second = generate(artifact, *args), generate(artifact, *args)
    assert json.loads(first.stdout)["tokens"] == json.loads(second.stdout)["tokens"]


def test_generate_bad_input_is_one_line(artifact, tmp_path):
    result = generate(tmp_path / "missing", "--prompt", "hi")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 40
    result = generate(artifact, "--prompt", long_prompt)
    assert result.exit_code == 1 and "maximum model length 128" in result.stderr


def test_serve_without_artifact_explains_what_to_do(monkeypatch):
    result = runner.invoke(app, ["serve"])
    assert result.exit_code == 1
    assert "NEURON_COMPILED_ARTIFACTS" in result.stderr and "Traceback" not in result.output


def test_serve_print_command_for_a_torch_artifact(artifact):
    result = runner.invoke(app, ["serve", str(artifact), "--port", "9123", "--print-command"])
    assert result.exit_code == 0, result.output
    assert "-m neuronpack serve" in result.stdout and "--port 9123" in result.stdout
    data = json.loads(runner.invoke(app, ["serve", str(artifact), "--print-command", "--format", "json"]).stdout)
    assert data["argv"][1:4] == ["-m", "neuronpack", "serve"]
    result = runner.invoke(app, ["serve", str(artifact), "--print-command", "--tool-call-parser", "mistral"])
    assert result.exit_code == 1 and "parses hermes tool calls only" in result.stderr
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["serve", str(artifact), "--print-command", "--max-prefill-tokens", "16"])
    assert result.exit_code == 0 and "--max-num-batched-tokens 16" in result.stdout  # the old name, taken too
    result = runner.invoke(app, ["serve", str(artifact), "--print-command", "--no-enable-prefix-caching"])
    assert result.exit_code == 0 and "--no-enable-prefix-caching" in result.stdout
    result = runner.invoke(app, ["serve", str(artifact), "--print-command", "--prefix-cache-memory", "64"])
    assert result.exit_code == 0 and "--prefix-cache-memory 64" in result.stdout
    result = runner.invoke(app, ["serve", str(artifact), "--print-command", "--request-log", "r.jsonl",
                                 "--request-log-backups", "5", "--request-log-prompts"])
    assert result.exit_code == 0
    assert "--request-log r.jsonl --request-log-max-mib 64 --request-log-backups 5 --request-log-prompts" in (
        result.stdout)


def test_serve_request_log_options_are_checked_before_loading(artifact, tmp_path):
    result = runner.invoke(app, ["serve", str(artifact), "--request-log", str(tmp_path / "no" / "r.jsonl")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.startswith("error: the request log's directory does not exist")
    assert not (tmp_path / "no").exists()
    result = runner.invoke(app, ["serve", str(artifact), "--request-log-prompts"])
    assert result.exit_code == 2 and "add --request-log FILE" in result.stderr


def test_serve_nxd_artifact_hands_over_to_vllm(tiny_llama, tmp_path, nxd_sdk):
    from neuronpack.pipeline import compile_model

    path = compile_model(str(tiny_llama), overrides=TINY_NXD, out_root=tmp_path / "root").path
    result = runner.invoke(app, ["serve", str(path), "--port", "8080", "--print-command"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"cd {path} && NEURON_COMPILED_ARTIFACTS={path} VLLM_NEURON_FRAMEWORK=")
    assert "note: target vllm-neuron: no vLLM here" in result.stderr
    assert "-m vllm.entrypoints.openai.api_server" in result.stdout and "--port 8080" in result.stdout
    result = runner.invoke(app, ["serve", str(path), "--print-command", "--served-model-name", "mine",
                                 "--format", "json"])
    data = json.loads(result.stdout)
    assert data["target"] == "vllm-neuron" and data["cwd"] == str(path)
    argv = data["argv"]
    assert argv[argv.index("--served-model-name") + 1] == "mine"
    result = runner.invoke(app, ["serve", str(path), "--print-command", "--tool-call-parser", "hermes"])
    assert result.exit_code == 0 and "--enable-auto-tool-choice --tool-call-parser hermes" in result.stdout
    result = runner.invoke(app, ["serve", str(path), "--print-command", "--tool-call-parser", "hermes3"])
    assert result.exit_code == 1 and "registers no tool call parser 'hermes3'" in result.stderr
    assert "use one of: " in result.stderr and "Traceback" not in result.output
    # the tiny artifact samples on device (the recipe default): vllm-neuron would ignore the grammar bitmask
    result = runner.invoke(app, ["serve", str(path), "--print-command"])
    assert result.stderr.count("structured outputs are NOT enforced") == 1
    result = runner.invoke(app, ["serve", str(path), "--print-command", "--structured-outputs"])
    assert result.exit_code == 1 and "cannot be honoured" in result.stderr and "Traceback" not in result.output
    result = runner.invoke(app, ["serve", str(path), "--print-command", "--max-prefill-tokens", "16"])
    assert result.exit_code == 1 and "--max-num-batched-tokens" in result.stderr and "Traceback" not in result.output
    result = runner.invoke(app, ["serve", str(path), "--print-command", "--no-enable-prefix-caching"])
    assert result.exit_code == 1 and "vLLM's own prefix caching" in result.stderr
    host = compile_model(str(tiny_llama), overrides=[*TINY_NXD, "sampling.on_device=false"],
                         out_root=tmp_path / "root").path
    result = runner.invoke(app, ["serve", str(host), "--print-command", "--structured-outputs", "--vllm-target",
                                 "vllm-v0", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["env"]["NEURON_ON_DEVICE_SAMPLING_DISABLED"] == "1"
    result = runner.invoke(app, ["serve", str(path), "--print-command", "--vllm-target", "vllm-v3"])
    assert result.exit_code == 1 and "unknown vLLM target" in result.stderr
    result = runner.invoke(app, ["serve", str(path), "--print-command", "--request-log", "r.jsonl", "--format",
                                 "json"])
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and "--request-log" not in data["argv"]  # vLLM gets no such flag
    note = data["notes"][-1]
    assert note.startswith("--request-log is written by the built-in runtime only") and "--enable-log-requests" in note
    result = runner.invoke(app, ["serve", str(path)])  # no vLLM in this environment: a clear error, no exec
    assert result.exit_code == 1 and "vllm is not installed" in result.stderr


def test_serve_compiles_into_an_invalid_neuron_compiled_artifacts(tmp_path, tiny_llama, monkeypatch):
    target = tmp_path / "compiled-here"
    monkeypatch.setenv("NEURON_COMPILED_ARTIFACTS", str(target))
    result = runner.invoke(app, ["serve", "--print-command"])
    assert result.exit_code == 1 and "--model" in result.stderr  # nothing to compile it from
    sets = [a for s in [*SERVE_OVERRIDES, *EXPORT] for a in ("--set", s)]
    result = runner.invoke(app, ["serve", "--model", str(tiny_llama), "--recipe", str(RECIPE), *sets,
                                 "--print-command", "--quiet"])
    assert result.exit_code == 0, result.output
    assert (target / "neuronpack.json").is_file() and str(target) in result.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_serve(artifact: Path, port: int, *args: str) -> subprocess.Popen:
    """A real `neuronpack serve` process on loopback, returned once /health answers."""
    env = {**os.environ, "COLUMNS": "120"}
    proc = subprocess.Popen([sys.executable, "-m", "neuronpack", "serve", str(artifact), "--port", str(port),
                             "--threads", "1", "--served-model-name", "tiny", "--quiet", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    wait_for_health(proc, port)
    return proc


def test_serve_process_answers_openai_requests(artifact, tokenizer, tiny_llama, monkeypatch, tmp_path):
    from neuronpack.traffic import read_traffic

    port = _free_port()
    monkeypatch.setenv("NEURONPACK_API_KEY", "k")
    proc = _start_serve(artifact, port, "--request-log", str(tmp_path / "requests.jsonl"))
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        out = client.completions.create(model="tiny", prompt="Hello world", max_tokens=10, temperature=0)
        expected = hf_greedy(tiny_llama, tokenizer.encode("Hello world"), 10)
        assert out.choices[0].text == tokenizer.decode(expected)
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    # --quiet: no info lines, the URL line included (errors and warnings would still print)
    assert "serving tiny at" not in stderr and "loaded tiny" not in stderr
    [record] = read_traffic(tmp_path / "requests.jsonl").records  # written by the time the process ended
    assert (record.prompt_tokens, record.completion_tokens) == (out.usage.prompt_tokens, len(expected))


def test_sigterm_drains_in_flight_streams_then_exits_0(artifact):
    """SIGTERM with streams in flight: the port stops accepting at once, short streams finish, the rest end with
    an error event and [DONE] when the grace period is over, and the process exits 0."""
    import asyncio

    port, grace = _free_port(), 1.0
    proc = _start_serve(artifact, port, "--shutdown-grace", str(grace))
    url = f"http://127.0.0.1:{port}/v1/completions"
    # 4 short streams (done well within the grace) and 120 long ones (120 tokens each on 4 slots: 3600 decode
    # steps, more than any machine runs in the grace, so some are always still in flight when it ends).
    jobs = [8] * 4 + [120] * 120

    async def stream(client: httpx.AsyncClient, max_tokens: int, started: asyncio.Event) -> list[str]:
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}
        async with client.stream("POST", url, json=body) as response:
            events = []
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()
            return events

    async def run() -> tuple[list[list[str]], float, bool]:
        started = asyncio.Event()
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=256)) as client:
            tasks = [asyncio.create_task(stream(client, n, started)) for n in jobs]
            await asyncio.wait_for(started.wait(), 60)
            await asyncio.sleep(0.5)  # every request is in (running or waiting)
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            refused = False
            for _ in range(100):  # the listening socket closes within a moment, before the grace is over
                await asyncio.sleep(0.05)
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except OSError:
                    refused = proc.poll() is None
                    break
            results = await asyncio.gather(*tasks)
            return results, time.monotonic() - signalled, refused

    try:
        results, streams_ended_after, refused_while_draining = asyncio.run(run())
        code = proc.wait(timeout=120)  # then the engine stops and the interpreter exits (slow on a loaded machine)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert code == 0 and refused_while_draining
    assert streams_ended_after < grace + 10  # the grace period bounds the drain (not a speed target: 1 s + slack)
    completed = ended = 0
    for events in results:
        assert events[-1] == "[DONE]"  # every stream ends cleanly, none is cut
        last = json.loads(events[-2])
        if "error" in last:
            assert last["error"]["code"] == "shutting_down"
            ended += 1
        else:
            assert last["choices"][0]["finish_reason"] == "length"
            completed += 1
    assert completed >= 4 and ended >= 1 and completed + ended == len(jobs)


@pytest.mark.slow
def test_generate_on_an_aoti_artifact(tmp_path, tokenizer, tiny_llama):
    """AOTInductor graphs (C++ compiled): same greedy tokens as transformers. Two buckets keep the compile short."""
    aoti = build_artifact(tiny_llama, tmp_path / "aoti-root",
                          ["compiler=aoti", "buckets.context=[64]", "buckets.token_generation=[128]"])
    result = generate(aoti, "--prompt", "The quick brown fox", "--max-tokens", "16", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tokens"] == hf_greedy(tiny_llama, tokenizer.encode("The quick brown fox"), 16)
