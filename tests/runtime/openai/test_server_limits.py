"""The server's limits and error paths, on loopback with real clients: body size (413 before the body is read),
the bounded waiting queue (503 + Retry-After), the per-request deadline, and OpenAI-shaped errors everywhere."""

import asyncio
import json
import socket
import time

import httpx
import openai
import pytest

from neuronpack.runtime.engine import Engine, EngineLimits
from neuronpack.runtime.openai.http_limits import ServerLimits
from neuronpack.runtime.openai.server import create_app
from tests.runtime.serving import LiveServer, engine_server, metric_value

NAME = "tiny"
MAX_BODY = 64 * 1024
ERROR_KEYS = {"message", "type", "param", "code"}
LONG = {"model": NAME, "prompt": "Hello", "max_tokens": 120, "temperature": 0, "ignore_eos": True}


def serve(compiled_lm, artifact_tokenizer, **engine_limits) -> LiveServer:
    engine = Engine(compiled_lm, artifact_tokenizer, limits=EngineLimits(**engine_limits))
    return engine_server(engine, served_model_name=NAME, limits=ServerLimits(max_body_bytes=MAX_BODY))


@pytest.fixture(scope="module")
def server(compiled_lm, artifact_tokenizer):
    with serve(compiled_lm, artifact_tokenizer) as live:
        yield live


def raw_request(port: int, head: bytes, body: bytes) -> tuple[float, bytes]:
    """Send a request head and part of a body on a raw socket; return (seconds to the answer, the answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        started = time.monotonic()
        sock.sendall(head + body)
        data = b""
        while chunk := sock.recv(65536):  # the server closes the connection after a 413
            data += chunk
        return time.monotonic() - started, data


def error_of(response_bytes: bytes) -> tuple[int, dict]:
    head, _, body = response_bytes.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def test_a_body_over_the_limit_is_413_before_it_is_read(server):
    # 30 MB announced, 1 KB sent: the answer comes at once, so the rest was never waited for.
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 30000000\r\n\r\n")
    seconds, answer = raw_request(server.port, head, b'{"model": "tiny", "prompt": "' + b"a" * 1024)
    status, error = error_of(answer)
    assert status == 413 and set(error) == ERROR_KEYS and error["code"] == "request_too_large"
    assert str(MAX_BODY) in error["message"] and seconds < 10
    # Chunked (no Content-Length): refused as soon as the chunks pass the limit.
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"a" * 16384
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(5))  # 80 KB, never terminated
    _, answer = raw_request(server.port, head, body)
    assert error_of(answer)[0] == 413
    assert metric_value(httpx.get(f"{server.url}/metrics").text, "neuronpack_requests_rejected_total",
                        'reason="body_too_large"') == 2
    # Just under the limit: served normally (here a 400 for the prompt's length, from the engine).
    prompt = "word " * ((MAX_BODY - 200) // 5)
    response = httpx.post(f"{server.url}/v1/completions", json={"model": NAME, "prompt": prompt}, timeout=30)
    assert response.status_code == 400 and "maximum model length" in response.json()["error"]["message"]


def test_the_openai_client_sees_413_as_an_api_error(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30)
    with pytest.raises(openai.APIStatusError) as exc:
        client.completions.create(model=NAME, prompt="x" * (MAX_BODY + 1), max_tokens=1)
    assert exc.value.status_code == 413 and exc.value.body["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": NAME, "prompt": "\ud800", "max_tokens": 2}, "prompt"),
        ({"model": NAME, "prompt": ["ok", "x\udfff"], "max_tokens": 2}, "prompt.1"),
        ({"model": NAME, "prompt": "hi", "stop": "\ud800", "max_tokens": 2}, "stop"),
        ({"model": "\ud800", "prompt": "hi"}, "model"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(server, body, param):
    """Regression: a prompt holding "\\ud800" (valid JSON, not encodable text) was a plain-text 500."""
    response = httpx.post(f"{server.url}/v1/completions", content=json.dumps(body),  # ASCII JSON: "\ud800" escaped
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS and error["param"] == param and "surrogate" in error["message"]


def test_a_lone_surrogate_in_chat_messages_is_a_400(server):
    body = {"model": NAME, "messages": [{"role": "user", "content": [{"type": "text", "text": "a\ud800"}]}]}
    response = httpx.post(f"{server.url}/v1/chat/completions", content=json.dumps(body),
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages.0.content.0.text"


@pytest.mark.parametrize(
    ("method", "path", "content", "headers", "status", "says"),
    [
        ("POST", "/v1/completions", b"{not json", {"Content-Type": "application/json"}, 400, "not valid JSON"),
        ("POST", "/v1/completions", b'{"model": "tiny", "prompt": "hi"}', {"Content-Type": "text/plain"}, 400,
         "must be a JSON object"),
        ("POST", "/v1/completions", b"[1, 2]", {"Content-Type": "application/json"}, 400, "must be a JSON object"),
        ("POST", "/v1/completions", b'{"model": "tiny", "prompt": "\xff"}', {"Content-Type": "application/json"},
         400, "parsing the body"),
        ("GET", "/v1/nothing-here", b"", {}, 404, "Not Found: GET /v1/nothing-here"),
        ("GET", "/v1/completions", b"", {}, 405, "Method Not Allowed"),
        ("DELETE", "/health", b"", {}, 405, "Method Not Allowed"),
        ("POST", "/v1/completions", b'{"model": "tiny", "prompt": "hi", "seed": 100000000000000000000000}',
         {"Content-Type": "application/json"}, 400, "seed must be in"),
        ("POST", "/v1/completions", b'{"model": "tiny", "prompt": "hi", "seed": false}',
         {"Content-Type": "application/json"}, 400, "seed"),
        # Regression (schemathesis): echo decoded the prompt before its token ids were checked, a 500.
        ("POST", "/v1/completions", b'{"model": "tiny", "echo": true, "prompt": [97, -12439, 4496]}',
         {"Content-Type": "application/json"}, 400, "outside the vocabulary"),
    ],
)
def test_malformed_requests_get_openai_errors(server, method, path, content, headers, status, says):
    response = httpx.request(method, f"{server.url}{path}", content=content, headers=headers, timeout=30)
    assert response.status_code == status and response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS and says in error["message"]
    if status == 405:
        assert response.headers["allow"]


def test_an_unexpected_exception_is_a_json_500(compiled_lm, artifact_tokenizer):
    engine = Engine(compiled_lm, artifact_tokenizer)
    app = create_app(engine, served_model_name=NAME)

    @app.get("/boom")
    async def boom():
        raise RuntimeError("a bug")

    with LiveServer(app) as live:
        response = httpx.get(f"{live.url}/boom")
    assert response.status_code == 500 and response.headers["content-type"] == "application/json"
    assert response.json()["error"]["type"] == "server_error" and "RuntimeError" in response.json()["error"]["message"]


def test_the_openapi_document_declares_the_served_models_and_real_errors(server):
    schema = httpx.get(f"{server.url}/openapi.json").json()
    for component in ("CompletionRequest", "ChatCompletionRequest"):
        assert schema["components"]["schemas"][component]["properties"]["model"]["enum"] == [NAME]
    responses = schema["paths"]["/v1/completions"]["post"]["responses"]
    assert "422" not in responses and {"400", "404", "413", "503", "504"} <= set(responses)
    # Regression (schemathesis): a streamed answer's content type is declared too.
    assert set(responses["200"]["content"]) == {"application/json", "text/event-stream"}


async def _fire(url: str, n: int, **body) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(*(client.post(f"{url}/v1/completions", json={**LONG, **body})
                                      for _ in range(n)))


def test_a_full_queue_answers_503_with_retry_after(compiled_lm, artifact_tokenizer):
    with serve(compiled_lm, artifact_tokenizer, max_waiting=2) as live:  # batch 4 + 2 waiting
        reference = httpx.post(f"{live.url}/v1/completions", json=LONG, timeout=60).json()["choices"][0]["text"]
        responses = asyncio.run(_fire(live.url, 16))
        metrics = httpx.get(f"{live.url}/metrics").text
        assert live.engine.scheduler.idle and live.engine.in_flight == 0
    ok = [r for r in responses if r.status_code == 200]
    busy = [r for r in responses if r.status_code == 503]
    assert len(ok) + len(busy) == 16 and 6 <= len(ok) < 16
    assert all(r.json()["choices"][0]["text"] == reference for r in ok)  # those admitted are served intact
    for r in busy:
        assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "server_busy"
    assert metric_value(metrics, "neuronpack_requests_rejected_total", 'reason="queue_full"') == len(busy)


def test_the_openai_client_retries_a_503_and_gets_through(compiled_lm, artifact_tokenizer):
    with serve(compiled_lm, artifact_tokenizer, max_waiting=0) as live:

        async def run():
            client = openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=8, timeout=120)
            return await asyncio.gather(*(client.completions.create(model=NAME, prompt="Hello", max_tokens=24,
                                                                    temperature=0) for _ in range(8)))

        outs = asyncio.run(run())
        rejected = metric_value(httpx.get(f"{live.url}/metrics").text, "neuronpack_requests_rejected_total",
                                'reason="queue_full"')
    assert len({o.choices[0].text for o in outs}) == 1 and rejected >= 1


def test_a_request_past_its_deadline_ends_cleanly_and_frees_its_slot(compiled_lm, artifact_tokenizer):
    with serve(compiled_lm, artifact_tokenizer, request_timeout=0.4) as live:
        # 12 long requests on 4 slots: the later ones cannot finish in 0.4 s (they wait for a slot first).
        responses = asyncio.run(_fire(live.url, 12))
        with httpx.stream("POST", f"{live.url}/v1/completions", json={**LONG, "stream": True},
                          timeout=60) as stream_response:
            events = [line[6:] for line in stream_response.iter_lines() if line.startswith("data: ")]
        running_gauge = metric_value(httpx.get(f"{live.url}/metrics").text, "neuronpack_num_requests_running")
        metrics = httpx.get(f"{live.url}/metrics").text
        idle = live.engine.scheduler.idle and live.engine.in_flight == 0
    timed_out = [r for r in responses if r.status_code == 504]
    assert timed_out and all(r.status_code in (200, 504) for r in responses)
    for r in timed_out:
        error = r.json()["error"]
        assert set(error) == ERROR_KEYS and error["code"] == "request_timeout" and "0.4 s" in error["message"]
    # A stream gets its tokens so far, then an error event and [DONE] (never a cut connection).
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last.get("error", {}).get("code") == "request_timeout" or last["choices"][0]["finish_reason"] == "length"
    assert idle and running_gauge == 0
    assert metric_value(metrics, "neuronpack_requests_total", 'finish_reason="timeout"') >= len(timed_out)


def test_a_batch_refused_half_way_takes_back_what_it_queued(compiled_lm, artifact_tokenizer):
    """A batched prompt that fills the queue part-way: 503, and its first prompts do not linger in the engine."""
    with serve(compiled_lm, artifact_tokenizer, max_waiting=1) as live:  # room for 5: the 6-prompt batch overflows
        response = httpx.post(f"{live.url}/v1/completions", json={**LONG, "prompt": ["Hello"] * 6}, timeout=60)
        deadline = time.monotonic() + 20
        while live.engine.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        metrics = httpx.get(f"{live.url}/metrics").text
        assert response.status_code == 503 and live.engine.in_flight == 0
        assert metric_value(metrics, "neuronpack_requests_total", 'finish_reason="abort"') == 5  # not generated
        assert httpx.post(f"{live.url}/v1/completions", json={**LONG, "prompt": ["Hello"] * 5},
                          timeout=60).status_code == 200
