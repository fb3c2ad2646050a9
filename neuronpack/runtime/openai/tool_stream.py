"""A choice's generated text turned into OpenAI chat deltas: ``content`` pieces and ``tool_calls`` entries, as the
text streams in (``feed``) and when it ends (``finish``). The non-streaming response is the same deltas merged
(``parse_message``), so both paths read the model's output one way.

- auto: ``<tool_call>{...}</tool_call>`` blocks naming a declared function become tool calls (the text that may be
  the start of a ``<tool_call>`` tag is held back); anything else stays content, a block that does not parse too;
- required: the JSON array the grammar forced, parsed at the end;
- named: the arguments stream as they come, after a first delta with the call's id and name.

Example::

    stream = ToolCallStream(plan)
    deltas = stream.feed('Sure. <tool_call>{"name": "f", "arguments": {}}</tool_call>')
    deltas, finish_reason = stream.finish("stop")       # finish_reason "tool_calls"
"""

from __future__ import annotations

import json
from typing import Any

from neuronpack.runtime.openai.tools import ToolPlan, tool_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"
Delta = dict[str, Any]


class ToolCallStream:
    """One choice's deltas; ``plan`` None streams plain content."""

    def __init__(self, plan: ToolPlan | None) -> None:
        self.plan = plan
        self.calls = 0
        self._pending = ""  # auto: text not sent yet; required: the whole output
        self._inside = False  # auto: within a <tool_call> block

    def feed(self, text: str) -> list[Delta]:
        if not text:
            return []
        mode = self.plan.mode if self.plan is not None else "none"
        if mode == "none":
            return [{"content": text}]
        if mode == "named":
            if self.calls:
                return [_call_delta(0, {"function": {"arguments": text}})]
            self.calls = 1
            return [_call_delta(0, tool_call(self.plan.named, text))]
        self._pending += text
        return self._auto_deltas(final=False) if mode == "auto" else []

    def finish(self, finish_reason: str | None) -> tuple[list[Delta], str | None]:
        """The last deltas and the choice's finish_reason ("tool_calls" when a call was made and it ended well)."""
        mode = self.plan.mode if self.plan is not None else "none"
        deltas: list[Delta] = []
        if mode == "auto":
            deltas = self._auto_deltas(final=True)
        elif mode == "required":
            deltas = self._required_deltas()
        if self.calls and finish_reason == "stop" and mode in ("auto", "required"):
            finish_reason = "tool_calls"
        return deltas, finish_reason

    def _auto_deltas(self, *, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while self._pending:
            if not self._inside:
                start = self._pending.find(OPEN)
                if start < 0:
                    keep = 0 if final else _partial_tag(self._pending)
                    self._content(out, self._pending[: len(self._pending) - keep])
                    self._pending = self._pending[len(self._pending) - keep:]
                    return out
                self._content(out, self._pending[:start])
                self._pending, self._inside = self._pending[start + len(OPEN):], True
                continue
            end = self._pending.find(CLOSE)
            if end < 0 and not final:
                return out
            body = self._pending if end < 0 else self._pending[:end]
            self._pending = "" if end < 0 else self._pending[end + len(CLOSE):]
            self._inside = False
            call = self._parse_call(body)
            if call is None:
                self._content(out, f"{OPEN}{body}{CLOSE if end >= 0 else ''}")
            elif call:  # {}: a second call with parallel_tool_calls false, dropped
                out.append(call)
        return out

    def _parse_call(self, body: str) -> Delta | None:
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(value, dict) or not self.plan.declares(value.get("name")):
            return None
        arguments = value.get("arguments", value.get("parameters", {}))
        if not isinstance(arguments, dict):
            return None
        if self.calls and not self.plan.parallel:
            return {}  # parallel_tool_calls false: the first call only
        self.calls += 1
        return _call_delta(self.calls - 1, tool_call(value["name"], json.dumps(arguments, ensure_ascii=False)))

    def _required_deltas(self) -> list[Delta]:
        try:
            calls = json.loads(self._pending)
        except json.JSONDecodeError:  # cut by max_tokens: the text as it is
            return [{"content": self._pending}] if self._pending else []
        self.calls = len(calls)
        return [_call_delta(i, tool_call(c["name"], json.dumps(c["arguments"], ensure_ascii=False)))
                for i, c in enumerate(calls)]

    def _content(self, out: list[Delta], text: str) -> None:
        if text and not (self.calls and not text.strip()):  # no whitespace-only content between calls
            out.append({"content": text})


def parse_message(plan: ToolPlan | None, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
    """The non-streaming assistant message for a choice's whole text, and its finish_reason."""
    stream = ToolCallStream(plan)
    deltas = stream.feed(text)
    last, finish_reason = stream.finish(finish_reason)
    return merge_deltas([*deltas, *last]), finish_reason


def merge_deltas(deltas: list[Delta]) -> dict[str, Any]:
    """A choice's deltas put together as its message: the content, and the tool calls by index (a call streamed in
    pieces, its arguments after its name, becomes one). Content beside tool calls is stripped, None when empty."""
    content = "".join(d.get("content") or "" for d in deltas)
    calls: dict[int, dict[str, Any]] = {}
    for entry in (c for d in deltas for c in d.get("tool_calls", ())):
        call = calls.get(entry["index"])
        if call is None:
            calls[entry["index"]] = _whole_call(entry)
        else:
            call["function"]["arguments"] += entry.get("function", {}).get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": (content.strip() or None) if calls else content}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def _call_delta(index: int, call: dict[str, Any]) -> Delta:
    return {"tool_calls": [{"index": index, **call}]}


def _whole_call(entry: dict[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in entry.items() if k != "index"}, "function": dict(entry["function"])}


def _partial_tag(text: str) -> int:
    """How many trailing characters of ``text`` could begin ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0
