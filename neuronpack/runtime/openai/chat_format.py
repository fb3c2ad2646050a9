"""How one served model chats: the prompt a chat request becomes, and the deltas its output becomes. Two formats:

- ``TemplateChat``: the artifact's chat template (``chat_template_kwargs`` passed to it), Hermes tool calls
  (tool_stream.py), and with ``serve --reasoning-parser`` the thinking split out (reasoning.py);
- ``HarmonyChat`` (harmony.py): gpt-oss's harmony format, picked by the artifact's model type as vLLM picks it.

Both give, per choice, a ``ChoiceStream``: ``feed`` each engine output, ``finish`` at the end; the stream's deltas
are the SSE chunks, and merged (``chat_message``) the non-streaming message, so the two paths read the model's
output one way. Reasoning travels as ``{"reasoning": text}`` and leaves as both ``reasoning_content`` (vLLM up to
0.15, DeepSeek's name that most clients read) and ``reasoning`` (vLLM since 0.11.1, alone since 0.16).

Example::

    chat = TemplateChat(ThinkParser.load("qwen3", tokenizer.token_id))
    prepared = chat.prepare(engine, body, body.tool_plan())      # prompt ids, grammar, stop ids
    choice = chat.choice(body, body.tool_plan(), prepared)
    deltas = choice.feed(step_output)                            # [{"reasoning": "..."}, {"content": "..."}]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from neuronpack.runtime.openai.chat_prompt import chat_prompt
from neuronpack.runtime.openai.reasoning import ThinkParser, ThinkSplit
from neuronpack.runtime.openai.tool_stream import Delta, ToolCallStream, merge_deltas

if TYPE_CHECKING:
    from neuronpack.runtime.engine import Engine, StepOutput
    from neuronpack.runtime.openai.schema import ChatCompletionRequest
    from neuronpack.runtime.openai.tools import ToolPlan
    from neuronpack.runtime.structured import CompiledGrammar


@dataclass(frozen=True)
class PreparedChat:
    """A chat request ready for the engine: its prompt, the grammar its output must match (None: free text), the
    extra stop token ids of the format, and whether its output starts in the model's reasoning."""

    prompt_ids: list[int]
    grammar: CompiledGrammar | None
    stop_token_ids: tuple[int, ...] = ()
    thinking: bool = False


class ChoiceStream(Protocol):
    had_reasoning: bool  # the output started in its reasoning (a message's reasoning is "" rather than null)

    def feed(self, out: StepOutput) -> list[Delta]: ...

    def finish(self, finish_reason: str | None) -> tuple[list[Delta], str | None]: ...


class ChatFormat(Protocol):
    reasoning: bool  # messages carry reasoning_content (a reasoning parser is on)

    def prepare(self, engine: Engine, body: ChatCompletionRequest, plan: ToolPlan | None) -> PreparedChat: ...

    def choice(self, body: ChatCompletionRequest, plan: ToolPlan | None, prepared: PreparedChat) -> ChoiceStream: ...


class TemplateChat:
    """The chat template, Hermes tool calls, and with ``parser`` the reasoning split."""

    def __init__(self, parser: ThinkParser | None = None) -> None:
        self.parser = parser
        self.reasoning = parser is not None

    def prepare(self, engine: Engine, body: ChatCompletionRequest, plan: ToolPlan | None) -> PreparedChat:
        prompt_ids, grammar = chat_prompt(engine, body, plan)
        if self.parser is None:
            return PreparedChat(prompt_ids, grammar)
        thinking = self.parser.thinking(body.template_kwargs(), prompt_ids)
        if grammar is not None:  # vLLM: include_reasoning false constrains from the first token
            grammar = grammar.after(self.parser.gate(thinking and body.include_reasoning))
        return PreparedChat(prompt_ids, grammar, thinking=thinking)

    def choice(self, body: ChatCompletionRequest, plan: ToolPlan | None, prepared: PreparedChat) -> ChoiceStream:
        split = self.parser.split(thinking=prepared.thinking) if self.parser is not None else None
        return TemplateChoice(plan, split, include_reasoning=body.include_reasoning)


class TemplateChoice:
    """One choice of a template-formatted model: its text through the reasoning split, then the tool-call parser."""

    def __init__(self, plan: ToolPlan | None, split: ThinkSplit | None, *, include_reasoning: bool = True) -> None:
        self.tools = ToolCallStream(plan)
        self.split = split
        self.include_reasoning = include_reasoning

    @property
    def had_reasoning(self) -> bool:
        return self.split is not None and self.split.had_reasoning and self.include_reasoning

    def feed(self, out: StepOutput) -> list[Delta]:
        if self.split is None:
            return self.tools.feed(out.text)
        return self._route(self.split.feed(out.text))

    def finish(self, finish_reason: str | None) -> tuple[list[Delta], str | None]:
        deltas = self._route(self.split.finish()) if self.split is not None else []
        last, finish_reason = self.tools.finish(finish_reason)
        return [*deltas, *last], finish_reason

    def _route(self, pieces: list[Delta]) -> list[Delta]:
        out: list[Delta] = []
        for piece in pieces:
            if "content" in piece:
                out += self.tools.feed(piece["content"])
            elif self.include_reasoning:
                out.append(piece)
        return out


def chat_message(deltas: list[Delta], *, reasoning: bool, had_reasoning: bool = False) -> dict[str, Any]:
    """The non-streaming message of a choice's deltas. With a reasoning parser (``reasoning``), empty content is
    null and the message carries the reasoning (null when the output had none, as vLLM's message says)."""
    message = merge_deltas(deltas)
    if not reasoning:
        return message
    thought = "".join(d.get("reasoning") or "" for d in deltas)
    text = thought if thought or had_reasoning else None
    return {**message, "content": message["content"] or None, "reasoning_content": text, "reasoning": text}


def wire_delta(delta: Delta) -> Delta:
    """A delta as it is sent: reasoning under both of its names (vLLM's old and new)."""
    if "reasoning" not in delta:
        return delta
    return {**delta, "reasoning_content": delta["reasoning"]}
