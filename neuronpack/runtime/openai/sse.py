"""Server-sent event streams of /v1/completions and /v1/chat/completions: the chunks of each choice as the engine
produces them, then ``data: [DONE]``. A streaming response aborts its engine requests however it ends (the client
went away, even before the first chunk). A request that fails mid-stream gets one error event and the stream ends.

Chat chunks go through each choice's ``ChoiceStream`` (chat_format.py): plain ``content`` deltas, with tools the
``tool_calls`` deltas in OpenAI's shape (``tool_stream.py``), with a reasoning parser ``reasoning_content`` deltas.

Example::

    return sse(group, stream_chat(group, body, request_id, lambda: chat.choice(body, plan, prepared)))
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from neuronpack.runtime.engine.logprobs import TokenLogprobs
from neuronpack.runtime.engine.requests import StepOutput
from neuronpack.runtime.openai import responses as resp
from neuronpack.runtime.openai import schema as oa
from neuronpack.runtime.openai.chat_format import ChoiceStream, wire_delta
from neuronpack.runtime.openai.http_errors import HTTPError, raise_if_failed
from neuronpack.runtime.openai.streams import RequestGroup


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


def sse(group: RequestGroup, events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    """The SSE response of ``events`` (each one a ``data:`` line), closed by ``data: [DONE]``."""
    async def body() -> AsyncIterator[str]:
        async for event in events:
            yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"

    return _GroupStreamingResponse(group, body())


def stream_error(out: StepOutput) -> dict[str, Any] | None:
    """The error event of an output that ended the request badly, else None."""
    try:
        raise_if_failed(out)
    except HTTPError as exc:
        return oa.error_body(exc.message, exc.type, code=exc.code or exc.status)
    return None


def chat_logprobs(tokenizer, body: oa.ChatCompletionRequest, entries: list[TokenLogprobs] | None) -> dict | None:
    """A chat choice's ``logprobs`` object when the request asked for them."""
    if not body.logprobs:
        return None
    return resp.chat_logprobs(tokenizer, entries or [], body.top_logprobs or 0)


async def stream_completion(
    group: RequestGroup, body: oa.CompletionRequest, request_id: str, echo: list[tuple[str, list[int]]] | None
) -> AsyncIterator[dict[str, Any]]:
    with_usage = body.include_usage
    prompt_tokens = completion_tokens = cached_tokens = 0
    sent_text: dict[int, int] = {}  # choice index -> characters sent (logprobs text_offset)
    async for index, out in group:
        if (error := stream_error(out)) is not None:
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
                cached_tokens += out.num_cached_tokens
    if with_usage:
        yield resp.usage_chunk(request_id, body.model, "text_completion",
                               oa.usage(prompt_tokens, completion_tokens, cached_tokens))


async def stream_chat(group: RequestGroup, body: oa.ChatCompletionRequest, request_id: str,
                      new_choice: Callable[[], ChoiceStream], *, reasoning: bool = False
                      ) -> AsyncIterator[dict[str, Any]]:
    """A chat stream; ``reasoning``: the model's reasoning is parsed, so with ``include_reasoning`` false no chunk
    carries logprobs (their token texts would leak it; vLLM hides them too)."""
    with_usage = body.include_usage
    hide_logprobs = reasoning and not body.include_reasoning
    tokenizer = group.engine.tokenizer
    streams = [new_choice() for _ in range(body.n)]
    for index in range(body.n):
        yield resp.chat_chunk(request_id, body.model, index, {"role": "assistant", "content": ""}, None,
                              with_usage_field=with_usage)
    prompt_tokens = completion_tokens = cached_tokens = 0
    async for index, out in group:
        if (error := stream_error(out)) is not None:
            yield error
            return
        deltas = streams[index].feed(out)
        finish_reason = out.finish_reason.value if out.finish_reason else None
        if finish_reason:
            last, finish_reason = streams[index].finish(finish_reason)
            deltas += last
        logprobs = chat_logprobs(tokenizer, body, out.logprobs) if out.token_ids and not hide_logprobs else None
        if not deltas and (finish_reason or logprobs):
            deltas = [{}]
        for i, delta in enumerate(deltas):
            final = i == len(deltas) - 1
            yield resp.chat_chunk(request_id, body.model, index, wire_delta(delta), finish_reason if final else None,
                                  logprobs=logprobs if i == 0 else None, stop_reason=out.stop_reason,
                                  with_usage_field=with_usage)
        if out.finish_reason:
            completion_tokens += out.completion_tokens
            prompt_tokens = out.prompt_tokens
            if index == 0:  # the choice that looked the prompt up (the others copied it)
                cached_tokens = out.num_cached_tokens
    if with_usage:
        yield resp.usage_chunk(request_id, body.model, "chat.completion.chunk",
                               oa.usage(prompt_tokens, completion_tokens, cached_tokens))
