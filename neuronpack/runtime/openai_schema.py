"""OpenAI-compatible request models and response builders for /v1/completions and /v1/chat/completions.

Requests accept OpenAI's fields plus vLLM's sampling extensions (``top_k``, ``ignore_eos``, ``stop_token_ids``);
unknown fields are ignored like vLLM does. Fields this runtime cannot honour (``n`` > 1, ``logprobs``, penalties,
``logit_bias``, ``echo``, ``suffix``) are refused with 400 instead of being silently dropped.

Example::

    req = CompletionRequest.model_validate({"model": "m", "prompt": "Hi", "max_tokens": 8})
    body = completion_response("cmpl-1", "m", [("Hello", "length")], usage(2, 8))
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from neuronpack.errors import InvalidRequestError
from neuronpack.runtime.sampling import SamplingParams

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for the legacy completions endpoint


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None  # vLLM extension: < 1 means no limit (global_topk on Neuron)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def sampling_params(self) -> SamplingParams:
        """OpenAI defaults: temperature 1, top_p 1; top_k unlimited."""
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=-1 if self.top_k is None else self.top_k,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed,
        )

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def refuse_unsupported(self) -> None:
        """400 for options this runtime does not implement (never silently ignored)."""
        if self.n != 1:
            raise InvalidRequestError(f"n={self.n} is not supported; only n=1", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise InvalidRequestError(f"{name} is not supported by this runtime", param=name)
        if self.logit_bias:
            raise InvalidRequestError("logit_bias is not supported by this runtime", param="logit_bias")


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(COMPLETIONS_DEFAULT_MAX_TOKENS, ge=1)
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise InvalidRequestError("echo is not supported by this runtime", param="echo")
        if self.logprobs is not None:
            raise InvalidRequestError("logprobs are not supported by this runtime", param="logprobs")
        if self.suffix:
            raise InvalidRequestError("suffix is not supported by this runtime", param="suffix")
        if self.best_of not in (None, 1):
            raise InvalidRequestError("best_of > 1 is not supported by this runtime", param="best_of")

    def prompts(self) -> list[str | list[int]]:
        """The request's prompts (a batch gives one choice each, index in order)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    content: str | list[TextPart] | None = None

    def as_template_dict(self) -> dict[str, Any]:
        """The message as the chat template sees it (text parts joined; other parts refused)."""
        data = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            texts = []
            for part in self.content:
                if part.type != "text" or part.text is None:
                    raise InvalidRequestError(f"content part type {part.type!r} is not supported (text only)",
                                              param="messages")
                texts.append(part.text)
            data["content"] = "".join(texts)
        return data


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs or self.top_logprobs:
            raise InvalidRequestError("logprobs are not supported by this runtime", param="logprobs")
        if self.tools:
            raise InvalidRequestError("tools are not supported by this runtime", param="tools")

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# ---- responses -------------------------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_response(
    request_id: str, model: str, choices: list[tuple[str, str | None]], usage_: dict[str, int]
) -> dict[str, Any]:
    """A non-streaming text_completion body; ``choices`` are (text, finish_reason) in index order."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "text": text, "logprobs": None, "finish_reason": reason}
            for i, (text, reason) in enumerate(choices)
        ],
        "usage": usage_,
    }


def completion_chunk(
    request_id: str, model: str, index: int, text: str, finish_reason: str | None, *, with_usage_field: bool
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def chat_response(
    request_id: str, model: str, text: str, finish_reason: str | None, usage_: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage_,
    }


def chat_chunk(
    request_id: str, model: str, delta: dict[str, str], finish_reason: str | None, *, with_usage_field: bool
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def usage_chunk(request_id: str, model: str, obj: str, usage_: dict[str, int]) -> dict[str, Any]:
    """The last streamed chunk when ``stream_options.include_usage`` is set: no choices, the request's usage."""
    return {"id": request_id, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage_}


ErrorType = Literal["invalid_request_error", "authentication_error", "not_found_error", "server_error"]


def error_body(message: str, type_: ErrorType, *, param: str | None = None, code: str | int | None = None) -> dict:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
