"""``serve --reasoning-parser NAME``: a reasoning model's thinking split from its answer, as vLLM's reasoning parsers
split it (vllm/reasoning/): the text between ``<think>`` and ``</think>`` goes to ``reasoning_content``, the rest to
``content``, in responses and stream deltas alike.

The names are vLLM's. ``qwen3`` (and ``mimo``, which vLLM maps to the same parser) follow vLLM's Qwen3 rules:

- a ``<think>`` the model writes is dropped (the hybrid Qwen3 templates let the model open it; Qwen3-Thinking-2507
  opens it in the prompt, so the output has only ``</think>``);
- no ``</think>`` in the output: everything is reasoning (a response cut by ``max_tokens`` while thinking), unless
  the request turned thinking off (``chat_template_kwargs: {"enable_thinking": false}``): then it is all content;
- a prompt that already closed the reasoning (the template wrote ``<think>\\n\\n</think>\\n\\n`` for
  ``enable_thinking`` false) makes the whole output content, as vLLM's serving layer routes it.

``deepseek_r1`` is the same mechanism without the switch: no ``</think>`` means all reasoning. Other names vLLM
knows (``VLLM_REASONING_PARSERS``) are refused by name; ``openai_gptoss`` is gpt-oss's harmony format (harmony.py).

The split works on the streamed text, holding back what may be the start of a tag, so a stream's deltas put
together are exactly the non-streaming message. Structured outputs and forced tool calls wait for the reasoning to
end: ``gate`` gives the grammar's ``ReasoningGate`` (runtime/structured), vLLM's ``is_reasoning_end``.

Example::

    parser = ThinkParser.load("qwen3", tokenizer.token_id)
    split = parser.split(thinking=True, prompt_ids=prompt)
    split.feed("<think>Let me see</thi") + split.feed("nk>Paris") + split.finish()
    # [{"reasoning": "Let me see"}, {"content": "Paris"}]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from neuronpack.errors import ServeError
from neuronpack.runtime.structured import ReasoningGate

# Every name vLLM's --reasoning-parser takes (vllm/reasoning/__init__.py, _REASONING_PARSERS_TO_REGISTER, main
# branch read 2026-12): a name outside it is not a parser anywhere; one inside it but not built in here is refused
# as such.
VLLM_REASONING_PARSERS = (
    "cohere_command3", "cohere_command4", "deepseek_r1", "deepseek_v3", "deepseek_v4", "ernie45", "gemma4", "glm45",
    "glm47", "granite", "holo2", "hunyuan_a13b", "hy_v3", "inkling", "kimi_k2", "kimi_k3", "mimo", "minimax_m2",
    "minimax_m2_append_think", "minimax_m3", "mistral", "nemotron_v3", "olmo3", "openai_gptoss", "poolside_v1",
    "qwen3", "seed_oss", "solar_open2", "step3", "step3p5",
)
HARMONY_PARSER = "openai_gptoss"  # gpt-oss: vLLM sets it itself for model_type gpt_oss (harmony.py)
Delta = dict[str, Any]


@dataclass(frozen=True)
class ThinkTags:
    """A tag-delimited reasoning format. ``switchable``: ``enable_thinking`` false in the request's template kwargs
    makes an output without an end tag all content (Qwen3); otherwise it is all reasoning (DeepSeek-R1)."""

    start: str
    end: str
    switchable: bool


THINK_PARSERS = {
    "qwen3": ThinkTags("<think>", "</think>", switchable=True),
    "mimo": ThinkTags("<think>", "</think>", switchable=True),  # vLLM: mimo -> its Qwen3 parser
    "deepseek_r1": ThinkTags("<think>", "</think>", switchable=False),
}
BUILT_IN_PARSERS = (*THINK_PARSERS, HARMONY_PARSER)


def check_reasoning_parser(name: str, *, where: str = "--reasoning-parser") -> None:
    """ServeError (what, where, fix) for a name vLLM does not know, or one this server does not implement."""
    if name in BUILT_IN_PARSERS:
        return
    if name not in VLLM_REASONING_PARSERS:
        raise ServeError(f"reasoning parser {name!r} not found. Available parsers: {', '.join(VLLM_REASONING_PARSERS)}",
                         where=where, fix=f"pass one of vLLM's names; this server implements {_built_in()}")
    raise ServeError(f"reasoning parser {name!r} is vLLM's, and the built-in server implements {_built_in()} only",
                     where=where, fix="pass one of those, or serve the model with vLLM")


def _built_in() -> str:
    return ", ".join(BUILT_IN_PARSERS)


@dataclass(frozen=True)
class ThinkParser:
    """One server's tag parser: its tags and their token ids in the artifact's vocabulary."""

    name: str
    tags: ThinkTags
    start_id: int
    end_id: int

    @classmethod
    def load(cls, name: str, token_id: Callable[[str], int | None], *, where: str = "tokenizer") -> ThinkParser:
        """The parser ``name`` for a tokenizer (``token_id``: a token's id from its text). ServeError when the
        vocabulary has no single token for a tag (vLLM: "could not locate think start/end tokens")."""
        check_reasoning_parser(name)
        tags = THINK_PARSERS[name]
        ids = [token_id(tags.start), token_id(tags.end)]
        if None in ids:
            raise ServeError(f"the {name} reasoning parser needs {tags.start} and {tags.end} as tokens of the "
                             "vocabulary, and this tokenizer has no such token", where=where,
                             fix=f"drop --reasoning-parser {name}: this model does not write its reasoning that way")
        return cls(name, tags, ids[0], ids[1])

    def prompt_ends_reasoning(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt closed the reasoning already: its last start or end tag is an end (vLLM's
        ``is_reasoning_end`` on the prompt)."""
        for token in reversed(prompt_ids):
            if token == self.start_id:
                return False
            if token == self.end_id:
                return True
        return False

    def thinking(self, template_kwargs: dict[str, Any] | None, prompt_ids: Sequence[int]) -> bool:
        """Whether this request's output starts in its reasoning."""
        if self.prompt_ends_reasoning(prompt_ids):
            return False
        return not (self.tags.switchable and (template_kwargs or {}).get("enable_thinking", True) is False)

    def gate(self, thinking: bool) -> ReasoningGate:
        """Where the request's grammar starts: after ``</think>``, or at once when it does not think."""
        return ReasoningGate((self.end_id,), (), ended=not thinking)

    def split(self, *, thinking: bool) -> ThinkSplit:
        return ThinkSplit(self.tags, thinking=thinking)


class ThinkSplit:
    """One choice's text, fed as it streams, into ``{"reasoning": ...}`` and ``{"content": ...}`` deltas.
    ``reasoning``: whether the output had any (None when it was all content, as vLLM's message says)."""

    def __init__(self, tags: ThinkTags, *, thinking: bool) -> None:
        self.tags = tags
        self._phase = "lead" if thinking else "content"  # lead: before a start tag may still come
        self._pending = ""
        self.had_reasoning = thinking

    def feed(self, text: str) -> list[Delta]:
        self._pending += text
        return self._drain(final=False)

    def finish(self) -> list[Delta]:
        """The text held back, at the end of the output (a partial tag is text after all)."""
        return self._drain(final=True)

    def _drain(self, *, final: bool) -> list[Delta]:
        out: list[Delta] = []
        if self._phase == "lead":
            self._lead(final)
        if self._phase == "reasoning":
            self._reasoning(out, final)
        if self._phase == "content" and self._pending:
            out.append({"content": self._pending})
            self._pending = ""
        return out

    def _lead(self, final: bool) -> None:
        # A start tag the model writes itself (after whitespace at most) is dropped with what precedes it.
        head = self._pending.lstrip()
        start = self.tags.start
        if head.startswith(start):
            self._pending = head[len(start):]
        elif start.startswith(head) and not final:
            return  # may still become the start tag: hold it
        self._phase = "reasoning"

    def _reasoning(self, out: list[Delta], final: bool) -> None:
        end = self.tags.end
        index = self._pending.find(end)
        if index >= 0:
            _append(out, "reasoning", self._pending[:index])
            self._pending = self._pending[index + len(end):]
            self._phase = "content"
            return
        keep = 0 if final else _partial_suffix(self._pending, end)
        _append(out, "reasoning", self._pending[: len(self._pending) - keep])
        self._pending = self._pending[len(self._pending) - keep:]


def _append(out: list[Delta], key: str, text: str) -> None:
    if text:
        out.append({key: text})


def _partial_suffix(text: str, tag: str) -> int:
    """How many trailing characters of ``text`` could begin ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
