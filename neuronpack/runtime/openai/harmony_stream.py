"""One gpt-oss choice's output tokens read by harmony's ``StreamableParser`` into chat deltas, as vLLM streams them
(vllm/entrypoints/openai/chat_completion/stream_harmony.py): each step's tokens grouped by (channel, recipient);
``final`` and recipient-less ``commentary`` (a preamble) to ``content``; ``analysis`` to reasoning; a message to
``functions.NAME`` (commentary or analysis channel) to a tool call: a first delta with its id, name and empty
arguments, then the arguments as they come. Two analysis messages are joined by a newline, as vLLM's non-streaming
message joins them; a choice that called a tool and stopped ends with finish_reason "tool_calls".

Output harmony cannot parse (a model that leaves the format) ends the parsing: the rest of the text is content.

Example::

    choice = HarmonyChoice(encoding)
    choice.feed(step_output)          # [{"reasoning": "The user asks"}], later [{"content": "Paris"}]
    deltas, finish_reason = choice.finish("stop")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuronpack.runtime.openai.tools import tool_call

if TYPE_CHECKING:
    from openai_harmony import HarmonyEncoding

    from neuronpack.runtime.engine import StepOutput

Delta = dict[str, Any]
FUNCTIONS = "functions."


class HarmonyChoice:
    """A ``ChoiceStream`` (chat_format.py) of harmony output. ``had_reasoning`` is False: no analysis, no
    reasoning (None), as vLLM's message says."""

    had_reasoning = False

    def __init__(self, encoding: HarmonyEncoding, *, include_reasoning: bool = True) -> None:
        from openai_harmony import Role, StreamableParser

        self._parser = StreamableParser(encoding, role=Role.ASSISTANT)
        self.include_reasoning = include_reasoning
        self.calls = 0  # tool calls opened
        self._recipient: str | None = None  # the recipient of the last tool call opened
        self._reasoning_messages = -1  # the parser's message count when reasoning was last sent
        self._broken = False

    def feed(self, out: StepOutput) -> list[Delta]:
        if self._broken:
            return [{"content": out.text}] if out.text else []
        states = []
        for token in out.token_ids:
            try:
                self._parser.process(token)
            except Exception:  # HarmonyError: the model left the format
                self._broken = True
                return self._deltas(states) + ([{"content": out.text}] if out.text else [])
            states.append((self._parser.current_channel, self._parser.current_recipient,
                           self._parser.last_content_delta or ""))
        return self._deltas(states)

    def finish(self, finish_reason: str | None) -> tuple[list[Delta], str | None]:
        return [], "tool_calls" if self.calls and finish_reason == "stop" else finish_reason

    def _deltas(self, states: list[tuple[str | None, str | None, str]]) -> list[Delta]:
        out: list[Delta] = []
        for channel, recipient, text in _groups(states):
            if recipient and recipient.startswith(FUNCTIONS) and channel in ("commentary", "analysis"):
                out += self._call(recipient, text)
            elif channel == "final" or channel == "commentary" and recipient is None:
                if text:
                    out.append({"content": text})
            elif channel == "analysis" and self.include_reasoning and text:
                out.append({"reasoning": self._reasoning(text)})
        return out

    def _call(self, recipient: str, text: str) -> list[Delta]:
        out = []
        if recipient != self._recipient:  # a new call: its id and name first
            self._recipient = recipient
            self.calls += 1
            out.append({"tool_calls": [{"index": self.calls - 1, **tool_call(recipient[len(FUNCTIONS):], "")}]})
        if text:
            out.append({"tool_calls": [{"index": self.calls - 1, "function": {"arguments": text}}]})
        return out

    def _reasoning(self, text: str) -> str:
        messages = len(self._parser.messages)
        joined = "\n" + text if self._reasoning_messages not in (-1, messages) else text
        self._reasoning_messages = messages
        return joined


def _groups(states: list[tuple[str | None, str | None, str]]) -> list[tuple[str | None, str | None, str]]:
    """Consecutive tokens of one (channel, recipient) with their text joined."""
    groups: list[tuple[str | None, str | None, str]] = []
    for channel, recipient, text in states:
        if groups and groups[-1][:2] == (channel, recipient):
            groups[-1] = (channel, recipient, groups[-1][2] + text)
        else:
            groups.append((channel, recipient, text))
    return groups
