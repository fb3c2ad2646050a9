"""The OpenAI-compatible server on loopback, driven by the official openai client."""

import shutil

import httpx
import openai
import pytest

from neuronpack.runtime.engine import Engine
from neuronpack.runtime.openai.server import create_app
from tests.runtime.serving import LiveServer, engine_server, hf_greedy, metric_value

NAME = "tiny"
KEY = "sk-test-123"


@pytest.fixture(scope="module")
def server(compiled_lm, artifact_tokenizer):
    with engine_server(Engine(compiled_lm, artifact_tokenizer), served_model_name=NAME, api_key=KEY) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60)


def test_models_health_and_metrics(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [NAME]
    assert httpx.get(f"{server.url}/health").status_code == 200  # no key needed
    text = httpx.get(f"{server.url}/metrics").text
    assert "neuronpack_num_requests_waiting" in text and "neuronpack_batch_slots 4.0" in text


def test_completion_greedy_equals_transformers(client, server, tiny_llama):
    tok = server.engine.tokenizer
    prompt = "The quick brown fox"
    out = client.completions.create(model=NAME, prompt=prompt, max_tokens=20, temperature=0)
    expected = hf_greedy(tiny_llama, tok.encode(prompt), 20)
    choice = out.choices[0]
    assert choice.text == tok.decode(expected)
    assert out.usage.prompt_tokens == len(tok.encode(prompt)) and out.usage.completion_tokens == len(expected)
    assert choice.finish_reason == ("stop" if expected[-1] == tok.eos_token_id else "length")
    assert out.model == NAME and out.id.startswith("cmpl-")


def test_chat_greedy_equals_transformers_on_the_chat_template(client, server, tiny_llama):
    tok = server.engine.tokenizer
    messages = [{"role": "user", "content": "Hello world! How are you today?"}]
    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, temperature=0)
    prompt_ids = tok.encode_chat(messages)
    expected = hf_greedy(tiny_llama, prompt_ids, 16)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == tok.decode(expected)
    assert out.usage.prompt_tokens == len(prompt_ids) and out.usage.completion_tokens == len(expected)


def test_streaming_completion_and_usage(client):
    kwargs = dict(model=NAME, prompt="Hello world! How are", max_tokens=24, temperature=0)
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == full.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_streaming_chat(client):
    kwargs = dict(model=NAME, messages=[{"role": "user", "content": "The quick brown fox?"}], max_tokens=20,
                  temperature=0)
    full = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_seeded_sampling_is_reproducible_over_http(client):
    kwargs = dict(model=NAME, prompt="Hello", max_tokens=16, temperature=1.0, top_p=0.9,
                  extra_body={"top_k": 40, "ignore_eos": True})
    a = client.completions.create(**kwargs, seed=7).choices[0].text
    assert client.completions.create(**kwargs, seed=7).choices[0].text == a
    assert client.completions.create(**kwargs, seed=8).choices[0].text != a


def test_stop_strings_and_batched_prompts(client):
    base = client.completions.create(model=NAME, prompt="The quick", max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base[5:7]  # a string known to appear in the greedy output
    out = client.completions.create(model=NAME, prompt="The quick", max_tokens=24, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].text == base[: base.index(stop)] and out.choices[0].finish_reason == "stop"
    batch = client.completions.create(model=NAME, prompt=["The quick", "Hello"], max_tokens=8, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    single = client.completions.create(model=NAME, prompt="Hello", max_tokens=8, temperature=0)
    assert batch.choices[1].text == single.choices[0].text


def test_prompt_too_long_is_400_with_the_limits(client, server):
    tok = server.engine.tokenizer
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 40  # prompts up to 127 tokens are chunked
    assert len(tok.encode(long_prompt)) >= 128
    for create in (
        lambda: client.completions.create(model=NAME, prompt=long_prompt, max_tokens=4),
        lambda: client.completions.create(model=NAME, prompt=long_prompt, max_tokens=4, stream=True),
        lambda: client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": long_prompt}]),
    ):
        with pytest.raises(openai.BadRequestError) as exc:
            create()
        assert exc.value.status_code == 400
        message = exc.value.body["message"]
        assert "no room to generate below the maximum model length 128" in message
        assert exc.value.body["param"] == "prompt"


def test_errors_use_openai_shapes(client, server):
    with pytest.raises(openai.NotFoundError) as exc:
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    assert exc.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=NAME, prompt="hi", max_tokens=2, temperature=-1)
    assert exc.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError, match="presence_penalty is not supported") as exc:
        client.completions.create(model=NAME, prompt="hi", max_tokens=2, presence_penalty=1.0)
    assert exc.value.body["param"] == "presence_penalty"
    with pytest.raises(openai.BadRequestError, match="max_tokens 0 only makes sense with echo"):
        client.completions.create(model=NAME, prompt="hi", max_tokens=0)
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    bad_json = httpx.post(f"{server.url}/v1/completions", content=b"{not json", headers=auth)
    assert bad_json.status_code == 400 and set(bad_json.json()["error"]) == {"message", "type", "param", "code"}
    missing = httpx.post(f"{server.url}/v1/completions", json={"model": NAME}, headers=auth)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"


def test_server_faults_are_500_and_request_errors_400(compiled_lm, serve_artifact, tmp_path):
    """A template that refuses the messages is the client's problem (400); one that crashes is the server's (500)."""
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    tok_dir = tmp_path / "tokenizer"
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(serve_artifact / name, tok_dir / name)
    (tok_dir / "chat_template.jinja").write_text(
        "{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}{{ 1 // 0 }}")
    engine = Engine(compiled_lm, ArtifactTokenizer.from_dir(tok_dir))
    with LiveServer(create_app(engine, served_model_name=NAME)) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="one message only") as refused:
            client.chat.completions.create(model=NAME, max_tokens=2, messages=[
                {"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        assert refused.value.body["param"] == "messages"
        with pytest.raises(openai.InternalServerError, match="ZeroDivisionError") as fault:
            client.chat.completions.create(model=NAME, max_tokens=2, messages=[{"role": "user", "content": "a"}])
        assert fault.value.body["type"] == "server_error" and fault.value.status_code == 500
        assert set(fault.value.body) == {"message", "type", "param", "code"}


def test_api_key_is_required_on_v1(server):
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as exc:
        bad.models.list()
    assert exc.value.status_code == 401 and exc.value.body["code"] == "invalid_api_key"
    missing = httpx.post(f"{server.url}/v1/completions", json={})  # no Authorization header at all
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"


def test_disconnect_mid_stream_frees_the_slot(server):
    body = {"model": NAME, "prompt": "Hello", "max_tokens": 120, "temperature": 0, "stream": True,
            "ignore_eos": True}
    before = metric_value(httpx.get(f"{server.url}/metrics").text, "neuronpack_requests_total",
                          'finish_reason="abort"')
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
    # The client is gone after two chunks; the engine must drop the request long before its 120 tokens.
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = httpx.get(f"{server.url}/metrics").text
        if metric_value(text, "neuronpack_requests_total", 'finish_reason="abort"') == before + 1:
            break
        time.sleep(0.05)
    assert metric_value(text, "neuronpack_requests_total", 'finish_reason="abort"') == before + 1
    assert metric_value(text, "neuronpack_num_requests_running") == 0
    assert server.engine.scheduler.idle


def test_load_32_concurrent_streams_complete_ungarbled(server, client):
    import asyncio

    words = "The quick brown fox jumps over the lazy dog. Hello world! How are you today?".split()
    jobs = [(" ".join(words[: 1 + (i * 7) % len(words)]), 2 + (i * 11) % 60) for i in range(32)]  # mixed lengths
    sequential = [client.completions.create(model=NAME, prompt=p, max_tokens=n, temperature=0).choices[0]
                  for p, n in jobs]

    async def stream(aclient, prompt, max_tokens):
        text, reasons = [], []
        chunks = await aclient.completions.create(model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                                  stream=True)
        async for chunk in chunks:
            text.append(chunk.choices[0].text)
            reasons.append(chunk.choices[0].finish_reason)
        return "".join(text), reasons

    async def run_all():
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)
        return await asyncio.gather(*(stream(aclient, p, n) for p, n in jobs))

    results = asyncio.run(run_all())
    assert len(results) == 32
    for (text, reasons), expected in zip(results, sequential, strict=True):
        assert text == expected.text  # nothing lost, nothing from another stream
        assert reasons[-1] == expected.finish_reason and all(r is None for r in reasons[:-1])
    assert httpx.get(f"{server.url}/health").status_code == 200
    metrics = httpx.get(f"{server.url}/metrics").text
    assert metric_value(metrics, "neuronpack_num_requests_running") == 0
    assert metric_value(metrics, "neuronpack_num_requests_waiting") == 0
    # The batch was actually shared: some decode steps ran with every slot busy.
    assert metric_value(metrics, "neuronpack_decode_batch_occupancy_bucket", 'le="0.875"') < metric_value(
        metrics, "neuronpack_decode_batch_occupancy_count")


def test_chat_templates_render_on_the_apps_few_threads(server):
    """32 concurrent chats start no thread per request: every thread that allocates keeps a malloc arena resident
    (bench/serve_memory.py)."""
    import asyncio
    import threading

    from neuronpack.runtime.openai.server import TEMPLATE_THREADS

    def names():
        return [t.name for t in threading.enumerate()]

    before = names()

    async def chat(aclient, i):
        stream = await aclient.chat.completions.create(model=NAME, messages=[{"role": "user", "content": f"hi {i}"}],
                                                       max_tokens=3, temperature=0, stream=True)
        return [chunk async for chunk in stream]

    async def run_all():
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)
        return await asyncio.gather(*(chat(aclient, i) for i in range(32)))

    assert all(asyncio.run(run_all()))
    started = [n for n in names() if n not in before]
    assert len([n for n in started if n.startswith("neuronpack-blocking")]) <= TEMPLATE_THREADS
    assert not [n for n in started if "AnyIO" in n or "worker" in n.lower()], started


def test_completion_prompts_tokenize_on_the_apps_threads(server, client, monkeypatch):
    """/v1/completions encodes its prompts off the event loop, on the threads chat templates use."""
    import threading

    tokenizer = server.engine.tokenizer
    threads = []

    def encode(text, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return original(text, *args, **kwargs)

    original = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", encode)
    client.completions.create(model=NAME, prompt=["hello", "hi there"], max_tokens=1, temperature=0)
    assert len(threads) == 2 and all(n.startswith("neuronpack-blocking") for n in threads), threads
