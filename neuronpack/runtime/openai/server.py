"""The OpenAI-compatible HTTP server (FastAPI) in front of one engine.

Endpoints: ``GET /health``, ``GET /metrics`` (Prometheus), ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (both with SSE streaming, ``sse.py``), with structured outputs (``response_format``,
vLLM's ``structured_outputs`` / ``guided_*``) and tool calling (``tools``, ``tool_choice``) from
``runtime/structured``. Errors use OpenAI's shape (``http_errors.py``: 400 for the request, 413 for a body over the
limit, 503 when full, 500 for the server's fault). Chat templates are rendered and grammars compiled on worker
threads, never on the event loop nor the engine loop.

Example::

    app = create_app(engine, served_model_name="smollm2")
    run_server(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from neuronpack.errors import InvalidRequestError
from neuronpack.runtime.adapters import ServedModels
from neuronpack.runtime.engine import Engine, GenerationRequest, StepOutput
from neuronpack.runtime.engine.logprobs import TokenLogprobs
from neuronpack.runtime.engine.stopping import FinishReason
from neuronpack.runtime.limits import DEFAULT_SHUTDOWN_GRACE
from neuronpack.runtime.openai import responses as resp
from neuronpack.runtime.openai import schema as oa
from neuronpack.runtime.openai.chat_format import ChatFormat, PreparedChat, TemplateChat, chat_message
from neuronpack.runtime.openai.chat_prompt import request_grammar
from neuronpack.runtime.openai.http_errors import HTTPError, install_auth, install_error_handlers, raise_if_failed
from neuronpack.runtime.openai.http_limits import BodySizeLimit, ServerLimits, serve_gracefully
from neuronpack.runtime.openai.memory import release_memory_when_idle
from neuronpack.runtime.openai.openapi import declare_served_models
from neuronpack.runtime.openai.request_log import RequestLog
from neuronpack.runtime.openai.sse import chat_logprobs, sse, stream_chat, stream_completion
from neuronpack.runtime.openai.streams import RequestGroup, run_unless_disconnected
from neuronpack.runtime.openai.tools import ToolPlan
from neuronpack.runtime.structured import CompiledGrammar

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"; nobody reads it
TEMPLATE_THREADS = 2  # chat-template rendering holds the GIL: more threads would not render faster


def create_app(
    engine: Engine,
    *,
    served_model_name: str | Sequence[str],
    api_key: str | None = None,
    manage_engine: bool = True,
    model_info: dict[str, Any] | None = None,
    limits: ServerLimits | None = None,
    adapter_roots: dict[str, str] | None = None,
    request_log: RequestLog | None = None,
    chat_format: ChatFormat | None = None,
) -> FastAPI:
    """The FastAPI app for ``engine``. With ``manage_engine`` the app starts the engine thread on startup and stops it
    on shutdown. ``served_model_name`` (one or several names) is what requests must put in ``model``; the published
    OpenAPI document declares them. The engine's LoRA adapters are served under their own names too (vLLM's
    ``--lora-modules``; ``adapter_roots`` says where each lives, for ``/v1/models``): a request's ``model`` picks
    one. ``limits`` caps the request body (the engine's own limits bound the queue). ``request_log``: a line per
    request the engine finishes (request_log.py), started and closed with the app. ``chat_format``: how the model
    chats (chat_format.py; default: its chat template, no reasoning parser).

    Example: ``TestClient(create_app(engine, served_model_name="tiny")).get("/v1/models").json()["data"][0]["id"]``
    is ``"tiny"``.
    """
    base = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name)
    chat = chat_format or TemplateChat()
    served = ServedModels(base, engine.adapter_names, roots=adapter_roots or {})
    # Tokenizing, chat templates (and memory releases) run on a few threads of the app's own rather than one pooled
    # thread per concurrent request: every thread that allocates gets a malloc arena whose freed memory stays resident
    # (bench/serve_memory.py).
    blocking_pool = ThreadPoolExecutor(TEMPLATE_THREADS, thread_name_prefix="neuronpack-blocking")

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if request_log is not None:
            request_log.start()
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
            if request_log is not None:  # after the engine: the requests it ended have their lines
                request_log.close()

    app = FastAPI(title="neuronpack", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine
    install_error_handlers(app)
    install_auth(app, api_key)
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
        grammar = await off_loop(request_grammar, engine, body.grammar_spec())
        prompt_ids = await off_loop(_encode_prompts, engine.tokenizer, prompts)
        gen_requests = [_generation_request(body, ids, body.max_tokens, index=i, prompt_logprobs=body.prompt_logprobs,
                                            adapter=adapter, grammar=grammar)
                        for ids in prompt_ids for i in range(body.n)]
        request_id = f"cmpl-{uuid.uuid4().hex}"
        # validates every prompt first: 400 before any stream
        group = RequestGroup(engine, gen_requests, n=body.n, log=request_log)
        # Decoded only once validated (schemathesis: echo with a token id outside the vocabulary was a 500).
        echo = [(p if isinstance(p, str) else engine.tokenizer.decode(p), ids)
                for p, ids in zip(prompts, prompt_ids, strict=True) for _ in range(body.n)] if body.echo else None
        if body.stream:
            return sse(group, stream_completion(group, body, request_id, echo))
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
        plan = body.tool_plan()
        prepared = await off_loop(chat.prepare, engine, body, plan)
        gen_requests = [_generation_request(body, prepared.prompt_ids, body.completion_limit, index=i, adapter=adapter,
                                            grammar=prepared.grammar, stop_token_ids=prepared.stop_token_ids)
                        for i in range(body.n)]
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        group = RequestGroup(engine, gen_requests, n=body.n, log=request_log)
        if body.stream:
            return sse(group, stream_chat(group, body, request_id, lambda: chat.choice(body, plan, prepared),
                                          reasoning=chat.reasoning))
        completed, outputs = await run_unless_disconnected(request, _collect(group, len(gen_requests)))
        if not completed:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        choices = [_Choice.gather(outs) for outs in outputs]
        bodies = [_chat_choice(engine, chat, body, plan, prepared, i, outs, c)
                  for i, (outs, c) in enumerate(zip(outputs, choices, strict=True))]
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
        raise HTTPError(404, f"The model `{body.model}` does not exist. Served models: {', '.join(served.names)}",
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
                        prompt_logprobs: int | None = None, adapter: int = 0, grammar: CompiledGrammar | None = None,
                        stop_token_ids: tuple[int, ...] = ()) -> GenerationRequest:
    return GenerationRequest(
        adapter=adapter,
        prompt_ids=tuple(prompt_ids),
        sampling=body.sampling_params(index),
        max_tokens=max_tokens,
        stop=body.stop_strings(),
        stop_token_ids=(*(body.stop_token_ids or ()), *stop_token_ids),
        ignore_eos=body.ignore_eos,
        include_stop_str_in_output=body.include_stop_str_in_output,
        prompt_logprobs=prompt_logprobs,
        grammar=grammar,
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
    cached_tokens: int

    @classmethod
    def gather(cls, outs: list[StepOutput]) -> _Choice:
        last = outs[-1]
        raise_if_failed(last)
        return cls("".join(o.text for o in outs), [t for o in outs for t in o.token_ids],
                   [e for o in outs for e in (o.logprobs or ())], outs[0].prompt_logprobs, last.finish_reason,
                   last.stop_reason, last.prompt_tokens, last.completion_tokens, last.num_cached_tokens)


def _usage(choices: list[_Choice], n: int) -> dict[str, Any]:
    # Each prompt counts once however many choices it has (vLLM), its cached tokens too (those of its first choice,
    # which looked the prompt up); every choice's tokens count.
    firsts = choices[::n]
    return oa.usage(sum(c.prompt_tokens for c in firsts), sum(c.completion_tokens for c in choices),
                    sum(c.cached_tokens for c in firsts))


def _chat_choice(engine: Engine, chat: ChatFormat, body: oa.ChatCompletionRequest, plan: ToolPlan | None,
                 prepared: PreparedChat, index: int, outs: list[StepOutput], choice: _Choice) -> dict[str, Any]:
    """A non-streaming chat choice: its outputs through the same choice stream a stream uses, merged."""
    stream = chat.choice(body, plan, prepared)
    deltas = [d for out in outs for d in stream.feed(out)]
    last, finish_reason = stream.finish(choice.finish_reason and choice.finish_reason.value)
    message = chat_message([*deltas, *last], reasoning=chat.reasoning, had_reasoning=stream.had_reasoning)
    return resp.chat_choice(index, message, finish_reason, chat_logprobs(engine.tokenizer, body, choice.logprobs),
                            choice.stop_reason)


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
