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
State = tuple[Any, Any, int, str]  # a token's (channel, recipient, message number, text)
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
        self._call_opened: tuple[str, int] | None = None  # (recipient, message number) of the last call opened
        self._reasoning_message = -1  # the message number of the reasoning sent last
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
            # the message a token belongs to is numbered by the messages harmony completed before it
            states.append((self._parser.current_channel, self._parser.current_recipient, len(self._parser.messages),
                           self._parser.last_content_delta or ""))
        return self._deltas(states)

    def finish(self, finish_reason: str | None) -> tuple[list[Delta], str | None]:
        return [], "tool_calls" if self.calls and finish_reason == "stop" else finish_reason

    def _deltas(self, states: list[State]) -> list[Delta]:
        out: list[Delta] = []
        for channel, recipient, number, text in _groups(states):
            if recipient and recipient.startswith(FUNCTIONS) and channel in ("commentary", "analysis"):
                out += self._call(recipient, number, text)
            elif channel == "final" or channel == "commentary" and recipient is None:
                if text:
                    out.append({"content": text})
            elif channel == "analysis" and self.include_reasoning and text:
                out.append({"reasoning": self._reasoning(number, text)})
        return out

    def _call(self, recipient: str, number: int, text: str) -> list[Delta]:
        out = []
        if (recipient, number) != self._call_opened:  # a new call: its id and name first
            self._call_opened = (recipient, number)
            self.calls += 1
            out.append({"tool_calls": [{"index": self.calls - 1, **tool_call(recipient[len(FUNCTIONS):], "")}]})
        if text:
            out.append({"tool_calls": [{"index": self.calls - 1, "function": {"arguments": text}}]})
        return out

    def _reasoning(self, number: int, text: str) -> str:
        joined = "\n" + text if self._reasoning_message not in (-1, number) else text
        self._reasoning_message = number
        return joined


def _groups(states: list[State]) -> list[State]:
    """Consecutive tokens of one message (channel, recipient, number) with their text joined."""
    groups: list[State] = []
    for channel, recipient, number, text in states:
        if groups and groups[-1][:3] == (channel, recipient, number):
            groups[-1] = (channel, recipient, number, groups[-1][3] + text)
        else:
            groups.append((channel, recipient, number, text))
    return groups
