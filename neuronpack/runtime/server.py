"""The OpenAI-compatible HTTP server (FastAPI) in front of one engine.

Endpoints: ``GET /health``, ``GET /metrics`` (Prometheus), ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (both with SSE streaming). Errors use OpenAI's shape
``{"error": {"message", "type", "param", "code"}}``: 400 for invalid requests (``InvalidRequestError``, bad JSON and
field validation included, so the openai client raises BadRequestError), 401 for a wrong or missing API key, 404 for
an unknown model or route, 405 for a wrong method, 413 for a body over the limit, 503 (with Retry-After) when the
waiting queue is full or the server is shutting down, 504 past the request deadline, 500 for a server fault (the
model fails; any other ``ServeError``, e.g. a broken tokenizer or chat template; anything unexpected: never a
plain-text 500). Chat templates are rendered on a worker thread, never on the event loop. /health and /metrics never
need the API key (like vLLM).

Example::

    app = create_app(engine, served_model_name="smollm2")
    run_server(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from neuronpack.errors import InvalidRequestError, ServeError, ServerBusyError
from neuronpack.runtime import openai_responses as resp
from neuronpack.runtime import openai_schema as oa
from neuronpack.runtime.adapters import ServedModels
from neuronpack.runtime.engine import Engine, GenerationRequest, StepOutput
from neuronpack.runtime.http_limits import BodySizeLimit, ServerLimits, serve_gracefully
from neuronpack.runtime.limits import DEFAULT_SHUTDOWN_GRACE, RETRY_AFTER_SECONDS
from neuronpack.runtime.logprobs import TokenLogprobs
from neuronpack.runtime.memory import release_memory_when_idle
from neuronpack.runtime.openapi import declare_served_models
from neuronpack.runtime.stopping import FinishReason
from neuronpack.runtime.streams import RequestGroup, run_unless_disconnected

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"; nobody reads it
TEMPLATE_THREADS = 2  # chat-template rendering holds the GIL: more threads would not render faster


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, type_: oa.ErrorType, *, param=None, code=None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


class _ErrorResponse(JSONResponse):
    """An OpenAI-shaped error, rendered ASCII-only: whatever text it quotes (even a lone surrogate), it encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode()


def create_app(
    engine: Engine,
    *,
    served_model_name: str | Sequence[str],
    api_key: str | None = None,
    manage_engine: bool = True,
    model_info: dict[str, Any] | None = None,
    limits: ServerLimits | None = None,
    adapter_roots: dict[str, str] | None = None,
) -> FastAPI:
    """The FastAPI app for ``engine``. With ``manage_engine`` the app starts the engine thread on startup and stops it
    on shutdown. ``served_model_name`` (one or several names) is what requests must put in ``model``; the published
    OpenAPI document declares them. The engine's LoRA adapters are served under their own names too (vLLM's
    ``--lora-modules``; ``adapter_roots`` says where each lives, for ``/v1/models``): a request's ``model`` picks
    one. ``limits`` caps the request body (the engine's own limits bound the queue).

    Example: ``TestClient(create_app(engine, served_model_name="tiny")).get("/v1/models").json()["data"][0]["id"]``
    is ``"tiny"``.
    """
    base = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name)
    served = ServedModels(base, engine.adapter_names, roots=adapter_roots or {})
    # Tokenizing, chat templates (and memory releases) run on a few threads of the app's own rather than one pooled
    # thread per concurrent request: every thread that allocates gets a malloc arena whose freed memory stays resident
    # (bench/serve_memory.py).
    blocking_pool = ThreadPoolExecutor(TEMPLATE_THREADS, thread_name_prefix="neuronpack-blocking")

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if manage_engine:
            engine.start()
        # A burst of requests leaves freed memory resident: give it back whenever the server goes idle.
        releaser = asyncio.create_task(release_memory_when_idle(lambda: engine.in_flight, blocking_pool))
        try:
            yield
        finally:
            releaser.cancel()
            if manage_engine:
                engine.shutdown()

    app = FastAPI(title="neuronpack", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine
    _install_error_handlers(app)
    _install_auth(app, api_key)
    limits = limits or ServerLimits()
    if limits.max_body_bytes is not None:
        def count_rejection() -> None:
            engine.metrics.rejected.labels(reason="body_too_large").inc()

        app.add_middleware(BodySizeLimit, max_bytes=limits.max_body_bytes, on_reject=count_rejection)
    declare_served_models(app, served.names, with_api_key=bool(api_key))
    created = int(time.time())

    async def off_loop(fn, *args):
        """``fn(*args)`` on the app's blocking threads (tokenizing, chat templates): the event loop keeps serving."""
        return await asyncio.get_running_loop().run_in_executor(blocking_pool, fn, *args)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type=engine.metrics.content_type)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list",
                "data": served.cards(created=created, max_model_len=engine.max_model_len, base_info=model_info)}

    @app.post("/v1/completions")
    async def completions(body: oa.CompletionRequest, request: Request) -> Response:
        adapter = _check_request(body, served)
        body.refuse_unsupported()
        prompts = body.prompts()
        prompt_ids = await off_loop(_encode_prompts, engine.tokenizer, prompts)
        gen_requests = [_generation_request(body, ids, body.max_tokens, index=i, prompt_logprobs=body.prompt_logprobs,
                                            adapter=adapter) for ids in prompt_ids for i in range(body.n)]
        request_id = f"cmpl-{uuid.uuid4().hex}"
        group = RequestGroup(engine, gen_requests, n=body.n)  # validates every prompt first: 400 before any stream
        # Decoded only once validated (schemathesis: echo with a token id outside the vocabulary was a 500).
        echo = [(p if isinstance(p, str) else engine.tokenizer.decode(p), ids)
                for p, ids in zip(prompts, prompt_ids, strict=True) for _ in range(body.n)] if body.echo else None
        if body.stream:
            return _sse(group, _stream_completion(group, body, request_id, echo))
        completed, outputs = await run_unless_disconnected(request, _collect(group, len(gen_requests)))
        if not completed:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        choices = [_Choice.gather(outs) for outs in outputs]
        bodies = [_completion_choice(engine, body, index, choice, echo[index] if echo else None)
                  for index, choice in enumerate(choices)]
        return JSONResponse(resp.completion_response(request_id, body.model, bodies, _usage(choices, body.n)))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: oa.ChatCompletionRequest, request: Request) -> Response:
        adapter = _check_request(body, served)
        body.refuse_unsupported()
        messages = [m.as_template_dict() for m in body.messages]
        prompt_ids = await off_loop(engine.tokenizer.encode_chat, messages)
        gen_requests = [_generation_request(body, prompt_ids, body.completion_limit, index=i, adapter=adapter)
                        for i in range(body.n)]
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        group = RequestGroup(engine, gen_requests, n=body.n)
        if body.stream:
            return _sse(group, _stream_chat(group, body, request_id))
        completed, outputs = await run_unless_disconnected(request, _collect(group, len(gen_requests)))
        if not completed:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        choices = [_Choice.gather(outs) for outs in outputs]
        bodies = [resp.chat_choice(i, c.text, _chat_logprobs(engine, body, c.logprobs), c.finish_reason,
                                   c.stop_reason) for i, c in enumerate(choices)]
        return JSONResponse(resp.chat_response(request_id, body.model, bodies, _usage(choices, body.n)))

    return app


def run_server(app: FastAPI, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
               shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE) -> None:
    """Serve ``app`` with uvicorn until SIGTERM / SIGINT (blocking), then shut down gracefully: no new connections
    or requests, in-flight ones get ``shutdown_grace`` seconds to finish before they are ended cleanly."""
    serve_gracefully(app, app.state.engine, host=host, port=port, shutdown_grace=shutdown_grace,
                     log_level=log_level)


# ---- request building ----------------------------------------------------------------------------------------


def _encode_prompts(tokenizer, prompts) -> list[list[int]]:
    """Each completion prompt's token ids: a string is encoded, token ids are taken as they are."""
    return [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]


def _check_request(body: Any, served: ServedModels) -> int:
    """Text the tokenizer can encode (no lone UTF-16 surrogate anywhere), then a served model name; returns its
    adapter slot (0: the base model)."""
    _refuse_lone_surrogates(body.model_dump(exclude_none=True), "")
    adapter = served.adapter_slot(body.model)
    if adapter is None:
        raise _HTTPError(404, f"The model `{body.model}` does not exist. Served models: {', '.join(served.names)}",
                         "invalid_request_error", param="model", code="model_not_found")
    return adapter


def _refuse_lone_surrogates(value: Any, where: str) -> None:
    # JSON may escape a lone surrogate ("\ud800"); Python keeps it, and no UTF-8 encoder (tokenizer, response)
    # accepts it. Refused with 400 naming the field, like any invalid input.
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidRequestError(
                f"{where or 'the request'} holds an unpaired UTF-16 surrogate at character {exc.start}",
                param=where or None, fix="Send valid Unicode text (surrogates only in escaped pairs)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_lone_surrogates(key, where)
            _refuse_lone_surrogates(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_lone_surrogates(item, f"{where}.{index}")


def _generation_request(body: Any, prompt_ids: list[int], max_tokens: int | None, *, index: int = 0,
                        prompt_logprobs: int | None = None, adapter: int = 0) -> GenerationRequest:
    return GenerationRequest(
        adapter=adapter,
        prompt_ids=tuple(prompt_ids),
        sampling=body.sampling_params(index),
        max_tokens=max_tokens,
        stop=body.stop_strings(),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        include_stop_str_in_output=body.include_stop_str_in_output,
        prompt_logprobs=prompt_logprobs,
    )


async def _collect(group: RequestGroup, n: int) -> list[list[StepOutput]]:
    outputs: list[list[StepOutput]] = [[] for _ in range(n)]
    async for index, out in group:
        outputs[index].append(out)
    return outputs


@dataclass
class _Choice:
    """One choice's outputs put together (non-streaming)."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs]
    prompt_logprobs: list[TokenLogprobs | None] | None
    finish_reason: FinishReason | None
    stop_reason: str | int | None
    prompt_tokens: int
    completion_tokens: int

    @classmethod
    def gather(cls, outs: list[StepOutput]) -> _Choice:
        last = outs[-1]
        _raise_if_failed(last)
        return cls("".join(o.text for o in outs), [t for o in outs for t in o.token_ids],
                   [e for o in outs for e in (o.logprobs or ())], outs[0].prompt_logprobs, last.finish_reason,
                   last.stop_reason, last.prompt_tokens, last.completion_tokens)


def _usage(choices: list[_Choice], n: int) -> dict[str, int]:
    # Each prompt counts once however many choices it has (vLLM); every choice's tokens count.
    prompt_tokens = sum(c.prompt_tokens for c in choices[::n])
    return oa.usage(prompt_tokens, sum(c.completion_tokens for c in choices))


def _completion_choice(engine: Engine, body: oa.CompletionRequest, index: int, choice: _Choice,
                       echo: tuple[str, list[int]] | None) -> dict[str, Any]:
    text, token_ids = choice.text, choice.token_ids
    entries: list[TokenLogprobs | None] = list(choice.logprobs)
    if echo is not None:  # the prompt (and its logprobs) first, as vLLM does
        text, token_ids = echo[0] + text, [*echo[1], *token_ids]
        entries = [*(choice.prompt_logprobs or [None] * len(echo[1])), *entries]
    logprobs = None
    if body.logprobs is not None:
        logprobs = resp.completion_logprobs(engine.tokenizer, token_ids, entries, body.logprobs)
    return resp.completion_choice(index, text, logprobs, choice.finish_reason, choice.stop_reason)


def _chat_logprobs(engine: Engine, body: oa.ChatCompletionRequest, entries: list[TokenLogprobs] | None
                   ) -> dict | None:
    if not body.logprobs:
        return None
    return resp.chat_logprobs(engine.tokenizer, entries or [], body.top_logprobs or 0)


def _raise_if_failed(out: StepOutput) -> None:
    if out.finish_reason is FinishReason.ERROR:
        raise _HTTPError(500, f"generation failed: {out.error}", "server_error")
    if out.finish_reason is FinishReason.TIMEOUT:
        raise _HTTPError(504, f"{out.error} (neuronpack serve --request-timeout); {out.completion_tokens} tokens "
                         "were generated", "server_error", code="request_timeout")
    if out.finish_reason is FinishReason.ABORT:
        raise _HTTPError(503, "the server is shutting down", "server_error", code="shutting_down")


# ---- streaming -----------------------------------------------------------------------------------------------


class _GroupStreamingResponse(StreamingResponse):
    """A streaming response that aborts its engine requests however it ends (even before the first chunk)."""

    def __init__(self, group: RequestGroup, content: AsyncIterator[str]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._group = group

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._group.abort()


def _sse(group: RequestGroup, events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        async for event in events:
            yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"

    return _GroupStreamingResponse(group, body())


def _stream_error(out: StepOutput) -> dict[str, Any] | None:
    try:
        _raise_if_failed(out)
    except _HTTPError as exc:
        return oa.error_body(exc.message, exc.type, code=exc.code or exc.status)
    return None


async def _stream_completion(
    group: RequestGroup, body: oa.CompletionRequest, request_id: str, echo: list[tuple[str, list[int]]] | None
) -> AsyncIterator[dict[str, Any]]:
    with_usage = body.include_usage
    prompt_tokens = completion_tokens = 0
    sent_text: dict[int, int] = {}  # choice index -> characters sent (logprobs text_offset)
    async for index, out in group:
        if (error := _stream_error(out)) is not None:
            yield error
            return
        text, token_ids = out.text, list(out.token_ids)
        entries: list[TokenLogprobs | None] = list(out.logprobs or ())
        if echo is not None and index not in sent_text:  # the first chunk of a choice echoes the prompt
            text, token_ids = echo[index][0] + text, [*echo[index][1], *token_ids]
            entries = [*(out.prompt_logprobs or [None] * len(echo[index][1])), *entries]
        wants_logprobs = body.logprobs is not None and token_ids
        if text or out.finish_reason or wants_logprobs:
            logprobs = None
            if body.logprobs is not None:
                logprobs = resp.completion_logprobs(group.engine.tokenizer, token_ids, entries, body.logprobs,
                                                    initial_offset=sent_text.get(index, 0))
            choice = resp.completion_choice(index, text, logprobs, out.finish_reason, out.stop_reason)
            yield resp.completion_chunk(request_id, body.model, choice, with_usage_field=with_usage)
        sent_text[index] = sent_text.get(index, 0) + len(text)
        if out.finish_reason:
            completion_tokens += out.completion_tokens
            if index % body.n == 0:
                prompt_tokens += out.prompt_tokens
    if with_usage:
        yield resp.usage_chunk(request_id, body.model, "text_completion", oa.usage(prompt_tokens, completion_tokens))


async def _stream_chat(
    group: RequestGroup, body: oa.ChatCompletionRequest, request_id: str
) -> AsyncIterator[dict[str, Any]]:
    with_usage = body.include_usage
    for index in range(body.n):
        yield resp.chat_chunk(request_id, body.model, index, {"role": "assistant", "content": ""}, None,
                              with_usage_field=with_usage)
    prompt_tokens = completion_tokens = 0
    async for index, out in group:
        if (error := _stream_error(out)) is not None:
            yield error
            return
        if out.text or out.finish_reason or (body.logprobs and out.token_ids):
            delta = {"content": out.text} if out.text else {}
            logprobs = _chat_logprobs(group.engine, body, out.logprobs)
            yield resp.chat_chunk(request_id, body.model, index, delta, out.finish_reason, logprobs=logprobs,
                                  stop_reason=out.stop_reason, with_usage_field=with_usage)
        if out.finish_reason:
            completion_tokens += out.completion_tokens
            prompt_tokens = out.prompt_tokens
    if with_usage:
        yield resp.usage_chunk(request_id, body.model, "chat.completion.chunk",
                               oa.usage(prompt_tokens, completion_tokens))


# ---- errors and auth -----------------------------------------------------------------------------------------


def _install_error_handlers(app: FastAPI) -> None:
    def reply(status: int, message: str, type_: oa.ErrorType, param=None, code=None, headers=None) -> JSONResponse:
        return _ErrorResponse(oa.error_body(message, type_, param=param, code=code), status_code=status,
                              headers=headers)

    @app.exception_handler(_HTTPError)
    async def http_error(_req: Request, exc: _HTTPError) -> JSONResponse:
        return reply(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(InvalidRequestError)
    async def invalid(_req: Request, exc: InvalidRequestError) -> JSONResponse:
        return reply(400, exc.one_line(), "invalid_request_error", exc.param, 400)

    @app.exception_handler(ServeError)
    async def server_fault(_req: Request, exc: ServeError) -> JSONResponse:
        # not an InvalidRequestError (that handler is more specific): the server's fault, not the request's
        return reply(500, exc.one_line(), "server_error", None, 500)

    @app.exception_handler(ServerBusyError)
    async def busy(_req: Request, exc: ServerBusyError) -> JSONResponse:
        return reply(503, exc.one_line(), "server_error", None, "server_busy",
                     headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    @app.exception_handler(RequestValidationError)
    async def validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        param, message = _validation_message(exc.errors())
        return reply(400, message, "invalid_request_error", param, 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_exc(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_: oa.ErrorType = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = f"{exc.detail}: {req.method} {req.url.path}"
        return reply(exc.status_code, message, type_, None, exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(_req: Request, exc: Exception) -> JSONResponse:
        # The last resort (uvicorn still logs the traceback): the client gets JSON it can parse, not plain text.
        return reply(500, f"internal server error ({type(exc).__name__}); the server log has the details",
                     "server_error", None, 500)


def _validation_message(errors: Sequence[Any]) -> tuple[str | None, str]:
    """(param, message) for the first pydantic / JSON error of a request body."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", first.get("msg"))
        return None, f"the request body is not valid JSON: {detail} (at character {loc[0] if loc else 0})"
    if not loc and first.get("type") in ("model_attributes_type", "dict_type", "missing"):
        return None, "the request body must be a JSON object (send Content-Type: application/json)"
    param = ".".join(loc) or None
    return param, f"{param}: {first['msg']}" if param else str(first["msg"])


def _install_auth(app: FastAPI, api_key: str | None) -> None:
    if not api_key:
        return
    expected = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        if request.url.path.startswith("/v1"):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                body = oa.error_body("Incorrect or missing API key (send 'Authorization: Bearer <key>')",
                                     "authentication_error", code="invalid_api_key")
                return JSONResponse(body, status_code=401)
        return await call_next(request)
