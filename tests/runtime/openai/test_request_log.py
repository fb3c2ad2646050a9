"""The request log (`serve --request-log`), cached tokens in usage and vLLM's request histograms, through the OpenAI
server on loopback with the openai client: each request's line reads back through neuronpack.traffic and `neuronpack
buckets plan`, its counts are the responses' usage, `usage.prompt_tokens_details.cached_tokens` is the prefix
cache's hits, the log rotates within its bounds and holds no prompt text unless asked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from neuronpack.cli.app import app
from neuronpack.runtime.engine import Engine, GenerationRequest, StepOutput
from neuronpack.runtime.engine.stopping import FinishReason
from neuronpack.runtime.openai.request_log import RequestLog
from neuronpack.traffic import read_traffic
from tests.runtime.serving import engine_server, metric_value

NAME = "tiny"
RECIPES = Path(__file__).parents[3] / "recipes"
SYSTEM = "You answer in one word, and you never explain."
TEXT = "A recipe describes a build: model, target, buckets."  # longer than one 16-token block of the prefix cache


def client_of(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=120)


def cache_hits(live) -> float:
    return metric_value(httpx.get(f"{live.url}/metrics").text, "neuronpack_prefix_cache_hits_total")


def chat(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def streamed_usage(stream):
    chunks = list(stream)
    assert chunks[-1].choices == []  # include_usage: the last chunk carries the usage alone
    return chunks[-1].usage


def test_cached_tokens_in_usage_are_the_prefix_caches_hits(compiled_lm, artifact_tokenizer):
    """Completions and chat, plain and streamed with include_usage: each response's cached_tokens is what the prefix
    cache found for its prompt (the hits /metrics counted during it); a repeated prompt hits all but its last
    token."""
    with engine_server(Engine(compiled_lm, artifact_tokenizer), served_model_name=NAME) as live:
        client = client_of(live)
        calls = [
            lambda: client.completions.create(model=NAME, prompt=TEXT, max_tokens=3).usage,
            lambda: client.completions.create(model=NAME, prompt=TEXT, max_tokens=3).usage,
            lambda: streamed_usage(client.completions.create(model=NAME, prompt=TEXT + " Again.",
                                                             max_tokens=3, stream=True,
                                                             stream_options={"include_usage": True})),
            lambda: client.chat.completions.create(model=NAME, messages=chat("Red?"), max_tokens=3).usage,
            lambda: streamed_usage(client.chat.completions.create(model=NAME, messages=chat("Blue?"), max_tokens=3,
                                                                  stream=True,
                                                                  stream_options={"include_usage": True})),
            lambda: client.chat.completions.create(model=NAME, messages=chat("Blue?"), max_tokens=3, n=2,
                                                   temperature=1.0, seed=3).usage,
        ]
        cached = []
        for call in calls:
            before = cache_hits(live)
            usage = call()
            cached.append(usage.prompt_tokens_details.cached_tokens)
            assert cached[-1] == cache_hits(live) - before
        prompt = len(artifact_tokenizer.encode(TEXT))
        assert cached[:3] == [0, prompt - 1, prompt]  # the repeat: all but the last token; the longer one: all
        assert cached[4] > 0 and cached[5] == usage.prompt_tokens - 1  # the system prompt, then all of "Blue?"


def test_the_log_holds_each_requests_usage_and_reads_back(compiled_lm, artifact_tokenizer, tmp_path):
    log = tmp_path / "requests.jsonl"
    with engine_server(Engine(compiled_lm, artifact_tokenizer), served_model_name=NAME,
                       request_log=RequestLog(log, max_bytes=2**20, backups=1)) as live:
        client = client_of(live)
        usages = [  # one request each, then 2 choices of one prompt, then 2 prompts
            client.completions.create(model=NAME, prompt="The quick brown fox", max_tokens=6,
                                      extra_body={"ignore_eos": True}).usage,
            streamed_usage(client.chat.completions.create(model=NAME, messages=chat("Red?"), max_tokens=4,
                                                          stream=True, stream_options={"include_usage": True},
                                                          extra_body={"ignore_eos": True})),
            client.chat.completions.create(model=NAME, messages=chat("Red?"), max_tokens=5, n=2, temperature=1.0,
                                           seed=1, extra_body={"ignore_eos": True}).usage,
            client.completions.create(model=NAME, prompt=["Hello", "Hello world"], max_tokens=1).usage,
        ]
        metrics = httpx.get(f"{live.url}/metrics").text
    text = log.read_text()
    assert "quick brown" not in text and "Red?" not in text and '"prompt"' not in text
    records = read_traffic(log).records
    assert [r.completion_tokens for r in records] == [6, 4, 5, 5, 1, 1]
    assert sum(r.prompt_tokens for r in records[:3]) == sum(u.prompt_tokens for u in usages[:3])
    assert records[2].prompt_tokens == records[3].prompt_tokens == usages[2].prompt_tokens  # each choice: its line
    assert [r.cached_tokens for r in records[:3]] == [u.prompt_tokens_details.cached_tokens for u in usages[:3]]
    assert records[3].cached_tokens == records[3].prompt_tokens  # the second choice copied the first one's prompt
    assert sorted(r.prompt_tokens for r in records[4:]) == [len(artifact_tokenizer.encode(p))
                                                            for p in ("Hello", "Hello world")]
    for r in records:
        assert r.arrived_at <= r.first_token_at <= r.finished_at
    assert [r.batch for r in records[:2]] == [1, 1] and records[2].batch == records[3].batch == 2
    assert records[4].batch is records[5].batch is None  # one token each: no decode step
    # vLLM's request histograms: every finished request, on 1-2-5 boundaries up to the model length (128)
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    for name, counts in (("neuronpack_request_prompt_tokens", [r.prompt_tokens for r in records]),
                         ("neuronpack_request_generation_tokens", [r.completion_tokens for r in records])):
        samples = families[name].samples
        assert families[name].type == "histogram"
        buckets = {s.labels["le"]: s.value for s in samples if s.name.endswith("_bucket")}
        assert list(buckets) == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "+Inf"]
        assert all(buckets[le] == sum(c <= float(le) for c in counts) for le in buckets)
        total = {s.name.removeprefix(name): s.value for s in samples if not s.name.endswith("_bucket")}
        assert total["_count"] == len(records) and total["_sum"] == sum(counts)


def test_buckets_plan_reads_the_servers_log(compiled_lm, artifact_tokenizer, tmp_path):
    """The loop's first step: a server's log is what `neuronpack buckets plan --traffic` plans from."""
    log = tmp_path / "requests.jsonl"
    with engine_server(Engine(compiled_lm, artifact_tokenizer), served_model_name=NAME,
                       request_log=RequestLog(log, max_bytes=2**20, backups=1)) as live:
        client = client_of(live)
        for i, question in enumerate(["Red?", "Blue? Or green?", "Which colour is the sky on a clear day?"]):
            client.chat.completions.create(model=NAME, messages=chat(question), max_tokens=4 + 8 * i,
                                           extra_body={"ignore_eos": True})
    recipe = shutil.copy(RECIPES / "llama-3.1-8b-instruct-trn1.toml", tmp_path / "mine.toml")
    result = CliRunner().invoke(app, ["buckets", "plan", "--traffic", str(log), "--recipe", str(recipe),
                                      "--max-graphs", "4", "--format", "json"])
    assert result.exit_code == 0, result.output
    plan, records = json.loads(result.stdout), read_traffic(log).records
    assert plan["requests"] == 3 and plan["decode_steps"] == sum(r.completion_tokens - 1 for r in records)
    assert plan["planned"]["graphs"] <= 4 and plan["planned_dimensions"] == ["context", "token_generation"]
    assert plan["planned"]["padding"]["prompt_mean"] < plan["current"]["padding"]["prompt_mean"]


def test_prompts_are_written_only_when_asked(compiled_lm, artifact_tokenizer, tmp_path):
    log = tmp_path / "requests.jsonl"
    with engine_server(Engine(compiled_lm, artifact_tokenizer), served_model_name=NAME,
                       request_log=RequestLog(log, max_bytes=2**20, backups=1,
                                              decode=artifact_tokenizer.decode)) as live:
        client = client_of(live)
        client.completions.create(model=NAME, prompt="The quick brown fox", max_tokens=2)
        client.chat.completions.create(model=NAME, messages=chat("Red?"), max_tokens=2)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[0]["prompt"] == "The quick brown fox"
    ids = artifact_tokenizer.encode_chat(chat("Red?"))
    assert lines[1]["prompt"] == artifact_tokenizer.decode(ids) and "Red?" in lines[1]["prompt"]
    assert [r.prompt for r in read_traffic(log).records] == [None, None]  # the planner never reads it


def test_the_log_rotates_within_its_bounds(tmp_path):
    """RotatingFileHandler's rule: a file grows to the cap, then becomes FILE.1 (and FILE.1 FILE.2); 2 rotated files
    kept, the oldest lines deleted; every line whole, every file a log of its own."""
    path = tmp_path / "requests.jsonl"
    log = RequestLog(path, max_bytes=300, backups=2)
    log.start()
    for n in range(1, 21):
        trace = log.trace(GenerationRequest(prompt_ids=(5,) * n))
        for step, batch in enumerate((None, 3, 3)):
            done = FinishReason.LENGTH if step == 2 else None
            trace.observe(StepOutput("r", [7], "x", done, n, step + 1, num_cached_tokens=n // 2, batch=batch))
    log.close()
    files = [path.with_name(f"{path.name}.2"), path.with_name(f"{path.name}.1"), path]
    assert not path.with_name(f"{path.name}.3").exists()
    kept = []
    for file in files:
        assert 0 < file.stat().st_size <= 300
        kept += [r.prompt_tokens for r in read_traffic(file).records]
    assert kept == list(range(21 - len(kept), 21)) and len(kept) < 20  # the newest, in order; the oldest gone
    record = read_traffic(path).records[-1]
    assert (record.completion_tokens, record.cached_tokens, record.batch) == (3, 10, 3)


@pytest.mark.parametrize(("where", "message"), [("missing/requests.jsonl", "directory does not exist"),
                                                 (".", "is a directory")])
def test_a_log_that_cannot_be_written_is_one_error(tmp_path, where, message):
    from neuronpack.errors import ServeError

    with pytest.raises(ServeError) as err:
        RequestLog(tmp_path / where, max_bytes=100, backups=1)
    assert message in err.value.what and err.value.fix
