"""OpenAI response bodies and stream chunks for /v1/completions and /v1/chat/completions, logprobs included.

Shapes follow OpenAI and vLLM exactly: a completion choice is ``{index, text, logprobs, finish_reason,
stop_reason}`` with ``logprobs`` ``{text_offset, token_logprobs, tokens, top_logprobs}`` (each top dict holds the
chosen token plus the N best, keyed by token text); a chat choice carries ``logprobs: {content: [{token, logprob,
bytes, top_logprobs: [{token, logprob, bytes}]}]}`` with the N best per position. ``-inf`` (a token outside the
sampled candidates) is sent as -9999.0, as OpenAI and vLLM do. ``stop_reason`` (vLLM's extension) is the stop string
or stop token id that ended a choice, else null.

Example::

    lp = completion_logprobs(tok, token_ids=[5, 9], entries=[None, TokenLogprobs(9, -0.1, ((9, -0.1),))], top_n=1)
    body = completion_response("cmpl-1", "m", [completion_choice(0, "Hi", lp, "length", None)], usage(2, 0))
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from neuronpack.runtime.engine.logprobs import TokenLogprobs

MIN_LOGPROB = -9999.0  # what OpenAI and vLLM send instead of -inf


class TokenNamer(Protocol):
    def token_text(self, token_id: int) -> str: ...


def _lp(value: float) -> float:
    return max(value, MIN_LOGPROB)


def completion_logprobs(tok: TokenNamer, token_ids: Sequence[int], entries: Sequence[TokenLogprobs | None],
                        top_n: int, initial_offset: int = 0) -> dict[str, list]:
    """The completions ``logprobs`` object for ``token_ids`` (one entry per token, None for the first prompt token).
    ``initial_offset``: text already sent for this choice (streaming)."""
    offsets: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    tops: list[dict[str, float] | None] = []
    offset = initial_offset
    for token_id, entry in zip(token_ids, entries, strict=True):
        text = tok.token_text(token_id)
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
        if entry is None:
            token_logprobs.append(None)
            tops.append(None)
            continue
        token_logprobs.append(_lp(entry.logprob))
        # vLLM: the chosen token first, then the best ones, at most top_n + 1 distinct token ids.
        by_id = {token_id: entry.logprob}
        for best_id, best_lp in entry.top[:top_n]:
            by_id.setdefault(best_id, best_lp)
        tops.append({tok.token_text(i): _lp(v) for i, v in list(by_id.items())[: top_n + 1]})
    return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": tokens, "top_logprobs": tops}


def chat_logprobs(tok: TokenNamer, entries: Sequence[TokenLogprobs], top_n: int) -> dict[str, list]:
    """The chat ``logprobs`` object: per generated token its own logprob and the ``top_n`` best, best first."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = tok.token_text(token_id)
        return {"token": text, "logprob": _lp(logprob), "bytes": list(text.encode("utf-8", errors="replace"))}

    return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(i, v) for i, v in e.top[:top_n]]}
                        for e in entries]}


def completion_choice(index: int, text: str, logprobs: dict | None, finish_reason: str | None,
                      stop_reason: str | int | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def completion_response(request_id: str, model: str, choices: list[dict[str, Any]], usage_: dict[str, Any]
                        ) -> dict[str, Any]:
    """A non-streaming text_completion body (``choices`` from ``completion_choice``, in index order)."""
    return {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage_}


def completion_chunk(request_id: str, model: str, choice: dict[str, Any], *, with_usage_field: bool
                     ) -> dict[str, Any]:
    chunk: dict[str, Any] = {"id": request_id, "object": "text_completion", "created": int(time.time()),
                             "model": model, "choices": [choice]}
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def chat_choice(index: int, message: dict[str, Any], finish_reason: str | None, logprobs: dict | None,
                stop_reason: str | int | None) -> dict[str, Any]:
    """A chat choice; ``message``: ``{"role": "assistant", "content", ["tool_calls"]}``."""
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def chat_response(request_id: str, model: str, choices: list[dict[str, Any]], usage_: dict[str, Any]
                  ) -> dict[str, Any]:
    return {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage_}


def chat_chunk(request_id: str, model: str, index: int, delta: dict[str, Any], finish_reason: str | None, *,
               logprobs: dict | None = None, stop_reason: str | int | None = None, with_usage_field: bool
               ) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason
    chunk: dict[str, Any] = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()),
                             "model": model, "choices": [choice]}
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def usage_chunk(request_id: str, model: str, obj: str, usage_: dict[str, Any]) -> dict[str, Any]:
    """The last streamed chunk when ``stream_options.include_usage`` is set: no choices, the request's usage."""
    return {"id": request_id, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage_}
