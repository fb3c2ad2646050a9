"""Stop rules and incremental detokenization: when a sequence is finished, and which text may be streamed yet.

A sequence stops with finish_reason ``"stop"`` on an EOS / stop token or when a stop string appears (the stop string
and everything after it are trimmed, as OpenAI does), and with ``"length"`` on max_tokens or the model length.
With speculation, a sequence at length L with ``L + lookahead > max_model_len`` finishes one iteration early
(vLLM on Neuron), because the next step would write ``lookahead`` slots past the cache.

Streaming holds back the last ``len(longest stop) - 1`` characters: they might be the start of a stop string.
With ``include_stop_str_in_output`` (vLLM's extension) the stop string, or the stop token's text, stays in the
output and nothing is held back. ``stop_reason`` tells what stopped it: the stop string, the stop token id, or None
(EOS, length), as vLLM reports it.

Example::

    rules = StopRules(eos_token_ids=frozenset({2}), stop=("\\n\\n",), max_tokens=16, max_model_len=128)
    tracker = SequenceOutput(rules, prompt_ids=[5, 6], detokenizer=IncrementalDetokenizer(tok, [5, 6]))
    delta = tracker.append(42)      # Delta(text="...", finish_reason=None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol


class FinishReason(str, Enum):
    """Why a sequence ended; the values are OpenAI's ``finish_reason`` (and the metrics label)."""

    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the model length
    ABORT = "abort"  # the client went away or the server shut down
    ERROR = "error"  # the model failed
    TIMEOUT = "timeout"  # the server's per-request deadline (--request-timeout) passed

    def __str__(self) -> str:  # the wire value in f-strings and labels, on every Python version
        return self.value


# Prompt tokens decoded together with the first output tokens, so tokenizers that drop a leading space when a text
# starts (SentencePiece) still produce the right first word (vLLM uses the same window).
PROMPT_CONTEXT_TOKENS = 5


class Decoder(Protocol):
    def decode(self, ids: Sequence[int]) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding the whole output each step.

    Multi-byte characters split across tokens are held back until complete (decode ends with U+FFFD until then).
    """

    def __init__(self, decoder: Decoder, prompt_ids: Sequence[int]) -> None:
        self._decoder = decoder
        self._ids: list[int] = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one token; return the new text it completes ("" when it ends mid-character)."""
        self._ids.append(token_id)
        prefix_text = self._decoder.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decoder.decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """At the end of a sequence: the text still held back (an incomplete character decodes as U+FFFD)."""
        prefix_text = self._decoder.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decoder.decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :] if new_text.startswith(prefix_text) else ""


@dataclass(frozen=True)
class StopRules:
    """Everything that can end one sequence. ``max_model_len`` counts prompt + output tokens."""

    eos_token_ids: frozenset[int]
    max_tokens: int
    max_model_len: int
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    lookahead: int = 0  # speculation: num_lookahead_slots (0 without speculation)


@dataclass
class Delta:
    text: str  # newly streamable text (may be "")
    finish_reason: FinishReason | None = None


@dataclass
class SequenceOutput:
    """The output side of one sequence: token ids, text, what was already streamed, and the finish reason."""

    rules: StopRules
    prompt_ids: Sequence[int]
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    _emitted: int = 0  # characters of ``text`` already handed out

    def append(self, token_id: int, *, complete: bool = False) -> Delta:
        """Record one generated token; return the text that can be streamed now and the finish reason, if any.
        ``complete``: the request's grammar is complete with this token, it ends "stop" unless something else does.

        Example: with ``stop=("!",)`` appending the tokens of "Hi! there" yields "Hi" and finish_reason "stop".
        """
        if self.finish_reason is not None:
            raise RuntimeError("sequence already finished")
        self.token_ids.append(int(token_id))
        reason = self._check_token(int(token_id))
        hit_stop_string = False
        if reason is not None and self.rules.include_stop_str_in_output:
            self.text += self.detokenizer.push(int(token_id))  # the stop token's text stays (EOS decodes to "")
        if reason is None:
            self.text += self.detokenizer.push(int(token_id))
            reason = self._check_stop_strings()
            hit_stop_string = reason is not None
            if reason is None:
                reason = self._check_length()
            if reason is None and complete:
                reason = FinishReason.STOP
        if reason is not None and not hit_stop_string:
            # Ending for another reason: complete the text held back for an unfinished character.
            self.text += self.detokenizer.flush()
            reason = self._check_stop_strings() or reason
        self.finish_reason = reason
        return Delta(self._take_streamable(), self.finish_reason)

    def end(self, reason: FinishReason) -> Delta:
        """End without another token (a grammar's dead end): the text held back is released."""
        if self.finish_reason is not None:
            raise RuntimeError("sequence already finished")
        self.text += self.detokenizer.flush()
        self.finish_reason = reason
        return Delta(self._take_streamable(), reason)

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.token_ids)

    def _check_token(self, token_id: int) -> FinishReason | None:
        if token_id in self.rules.stop_token_ids:
            self.stop_reason = token_id
            return FinishReason.STOP
        if token_id in self.rules.eos_token_ids and not self.rules.ignore_eos:
            return FinishReason.STOP
        return None

    def _check_stop_strings(self) -> FinishReason | None:
        if not self.rules.stop:
            return None
        longest = max(len(s) for s in self.rules.stop)
        # Only the unstreamed tail plus a stop-string's width can hold a new match.
        start = max(0, self._emitted - longest)
        hits = [(i, s) for s in self.rules.stop if (i := self.text.find(s, start)) >= 0]
        if not hits:
            return None
        index, stop = min(hits)
        self.stop_reason = stop
        self.text = self.text[: index + len(stop) if self.rules.include_stop_str_in_output else index]
        return FinishReason.STOP

    def _check_length(self) -> FinishReason | None:
        if len(self.token_ids) >= self.rules.max_tokens:
            return FinishReason.LENGTH
        total = self.total_len
        if total >= self.rules.max_model_len or total + self.rules.lookahead > self.rules.max_model_len:
            return FinishReason.LENGTH
        return None

    def _take_streamable(self) -> str:
        end = len(self.text)
        if self.finish_reason is None and self.rules.stop and not self.rules.include_stop_str_in_output:
            end -= max(len(s) for s in self.rules.stop) - 1
        if end <= self._emitted:
            return ""
        out = self.text[self._emitted : end]
        self._emitted = end
        return out
