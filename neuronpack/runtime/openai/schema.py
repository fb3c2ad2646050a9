"""OpenAI-compatible request models for /v1/completions and /v1/chat/completions, and the error / usage shapes.

Requests accept OpenAI's fields plus vLLM's extensions (``top_k``, ``ignore_eos``, ``stop_token_ids``,
``include_stop_str_in_output``), structured outputs on both endpoints (``response_format``, ``structured_outputs``,
``guided_*``: ``structured_fields.py``) and tools on chat (``tools.py``). Known OpenAI / vLLM fields this
runtime does not implement (``UNSUPPORTED_FIELDS``: penalties, ``logit_bias``, ``suffix``, the legacy ``functions``,
...) are refused with 400 naming the field unless they carry their neutral value; names nobody defines are ignored,
as vLLM does.

Example::

    req = CompletionRequest.model_validate({"model": "m", "prompt": "Hi", "max_tokens": 8, "logprobs": 2})
    req.refuse_unsupported()
    req.sampling_params().logprobs      # 2
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from neuronpack.errors import InvalidRequestError
from neuronpack.runtime.engine.logprobs import MAX_LOGPROBS
from neuronpack.runtime.engine.sampling import SamplingParams
from neuronpack.runtime.openai.structured_fields import StructuredFields
from neuronpack.runtime.openai.tools import ToolFields

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for the legacy completions endpoint


def _unset(value: Any) -> bool:
    return value is None or value is False or value == 0 or value == "" or value == [] or value == {}


def _one(value: Any) -> bool:
    return value is None or value == 1


# Known request fields that change the output and that this runtime does not implement -> "this value is neutral".
UNSUPPORTED_FIELDS: dict[str, Callable[[Any], bool]] = {
    "presence_penalty": _unset,
    "frequency_penalty": _unset,
    "repetition_penalty": _one,
    "logit_bias": _unset,
    "min_p": _unset,
    "min_tokens": _unset,
    "best_of": _one,
    "use_beam_search": _unset,
    "length_penalty": _one,
    "suffix": _unset,
    "prompt_logprobs": lambda v: v is None,
    "prompt_embeds": lambda v: v is None,
    "functions": _unset,
    "function_call": lambda v: v in (None, "none"),
    "bad_words": _unset,
    "allowed_token_ids": lambda v: v is None,
    "logits_processors": _unset,
    "truncate_prompt_tokens": lambda v: v is None,
    "skip_special_tokens": lambda v: v in (None, True),
    "spaces_between_special_tokens": lambda v: v in (None, True),
    "return_tokens_as_token_ids": _unset,
    "return_token_ids": _unset,
    "echo": _unset,  # chat (completions declare their own echo)
    "add_generation_prompt": lambda v: v in (None, True),
    "continue_final_message": _unset,
    "chat_template": lambda v: v is None,
    "documents": _unset,
    "modalities": lambda v: v in (None, ["text"]),
    "audio": lambda v: v is None,
    "prediction": lambda v: v is None,
    "web_search_options": lambda v: v is None,
    "thinking_token_budget": lambda v: v is None,  # vLLM's cap on reasoning tokens
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class _SamplingFields(StructuredFields):
    # Extras are checked against UNSUPPORTED_FIELDS, others ignored; types are strict (no bool as a number).
    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None  # vLLM extension: < 1 means no limit (global_topk on Neuron)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=128)
    user: str | None = None

    def sampling_params(self, index: int = 0) -> SamplingParams:
        """OpenAI defaults: temperature 1, top_p 1; top_k unlimited. ``index``: which of the ``n`` choices; each
        gets seed + index when a seed is given (vLLM's rule), so the choices differ but stay reproducible."""
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=-1 if self.top_k is None else self.top_k,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=None if self.seed is None else self.seed + index,
            logprobs=self.sampled_logprobs,
        )

    @property
    def sampled_logprobs(self) -> int | None:
        return None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def refuse_unsupported(self) -> None:
        """400 for options this runtime does not implement (never silently ignored)."""
        for name, value in (self.model_extra or {}).items():
            neutral = UNSUPPORTED_FIELDS.get(name)
            if neutral is not None and not neutral(value):
                raise InvalidRequestError(f"{name} is not supported by this runtime", param=name,
                                          fix="Remove the field (docs/serve.md lists the supported ones)")


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(COMPLETIONS_DEFAULT_MAX_TOKENS, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @property
    def sampled_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def prompt_logprobs(self) -> int | None:
        """Prompt logprobs are computed when echoing with logprobs (what lm-eval's loglikelihood requests use)."""
        return self.logprobs if self.echo else None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequestError("max_tokens 0 only makes sense with echo (scoring the prompt)",
                                      param="max_tokens", fix="set echo: true, or ask for at least one token")

    def prompts(self) -> list[str | list[int]]:
        """The request's prompts (a batch gives ``n`` choices each, index in order)."""
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
        """The message as the chat template sees it (text parts joined; other parts refused). An assistant's
        reasoning is given under both of its names (``reasoning_content``, which templates such as Qwen3's read, and
        vLLM's newer ``reasoning``), whichever the client sent."""
        data = self.model_dump(exclude_none=True)
        reasoning = data.get("reasoning_content", data.get("reasoning"))
        if self.role == "assistant" and isinstance(reasoning, str):
            data["reasoning_content"] = data["reasoning"] = reasoning
        if isinstance(self.content, list):
            texts = []
            for part in self.content:
                if part.type != "text" or part.text is None:
                    raise InvalidRequestError(f"content part type {part.type!r} is not supported (text only)",
                                              param="messages")
                texts.append(part.text)
            data["content"] = "".join(texts)
        return data


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]  # vLLM's values


class ChatCompletionRequest(_SamplingFields, ToolFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM: more variables for the chat template
    reasoning_effort: ReasoningEffort | None = None  # OpenAI's; the template (or harmony) gets it
    include_reasoning: bool = True  # vLLM: false drops reasoning_content from the response

    def template_kwargs(self) -> dict[str, Any]:
        """The chat template's extra variables as vLLM builds them: ``chat_template_kwargs``, ``reasoning_effort``
        over the same key there, and with an effort set, ``enable_thinking`` (effort "none": false) unless the
        kwargs give it. InvalidRequestError for the keys vLLM refuses (``chat_template``, ``tokenize``)."""
        kwargs = dict(self.chat_template_kwargs or {})
        unexpected = sorted({"chat_template", "tokenize"} & kwargs.keys())
        if unexpected:
            raise InvalidRequestError(f"Found unexpected chat template kwargs from request: {unexpected}",
                                      param="chat_template_kwargs", fix="Remove them: the server sets those itself")
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
            kwargs.setdefault("enable_thinking", self.reasoning_effort != "none")
        return kwargs

    @property
    def sampled_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        self.template_kwargs()
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs: true", param="top_logprobs",
                                      fix="set logprobs: true, or drop top_logprobs")

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# ---- shared response pieces --------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's ``usage``, with ``prompt_tokens_details.cached_tokens``: the prompt tokens found in the prefix cache.
    Always present, 0 included, as OpenAI sends it and vLLM 0.24 with ``--enable-prompt-tokens-details`` (vLLM 0.9
    to 0.21 send it only with that flag and when it is not 0)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


ErrorType = Literal["invalid_request_error", "authentication_error", "not_found_error", "server_error"]


def error_body(message: str, type_: ErrorType, *, param: str | None = None, code: str | int | None = None) -> dict:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
