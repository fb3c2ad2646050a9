"""One request's grammar state while it decodes, and the token masks applied to the logits the sampler sees.

``Constraint`` wraps a request's llguidance matcher: ``consume`` follows each emitted token, ``masks_along`` gives the
allowed tokens at each position of a speculative draft (consuming the draft, then rolling back), ``trim`` cuts a
draft at its first token the grammar refuses. For JSON it also follows the digit bound of numbers
(``json_bounds.py``): every mask it gives refuses a digit past the bound, and ``trim`` cuts a draft there.
A reasoning model's grammar waits behind a ``ReasoningGate`` (grammar.py): its tokens are free until the reasoning
ends. ``Masks`` (computed on a worker thread while the model runs) and ``mask_logits`` set every refused token's
logit to -inf for the constrained rows of a batch, so greedy, top-k / top-p, temperature, seeds and logprobs all act
on the masked distribution.

Example::

    constraint = Constraint(grammar.new_matcher(), vocab_size)
    logits = mask_logits(logits, [constraint, None])     # row 0 constrained, row 1 free
    masks = Masks.start([constraint, None])              # before the model call ...
    logits = masks.apply(model_logits)                   # ... applied after it
    ok = constraint.consume(token)                       # False: the grammar refuses it
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from neuronpack.runtime.structured.json_bounds import START

if TYPE_CHECKING:
    import llguidance
    import numpy as np
    from torch import Tensor

    from neuronpack.runtime.structured.json_bounds import NumberBound


@dataclass(frozen=True)
class ReasoningGate:
    """When a reasoning model's grammar starts (vLLM's structured outputs with a reasoning parser): after the token
    sequence ``end`` (qwen3: ``</think>``; gpt-oss: ``<|start|>assistant<|channel|>final<|message|>``), looked for
    in the prompt's last tokens (``tail``) and the output; the tokens up to and including it are free. ``ended``:
    the prompt already ended the reasoning (e.g. ``enable_thinking`` false), the grammar applies from the first
    token."""

    end: tuple[int, ...]
    tail: tuple[int, ...] = ()
    ended: bool = False

    @classmethod
    def after_prompt(cls, end: tuple[int, ...], prompt_ids: list[int], ended: bool) -> ReasoningGate:
        return cls(end, tuple(prompt_ids[len(prompt_ids) - len(end) + 1:]) if len(end) > 1 else (), ended)


class Constraint:
    """A request's grammar matcher. ``done``: the grammar is complete (nothing more may follow); ``dead``: the
    matcher failed (a refused token or a dead end), the request ends with "length". With a ``gate`` (a reasoning
    model), tokens are free until the reasoning ends (``gated``), and the grammar applies from the next one."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, bound: NumberBound | None = None,
                 gate: ReasoningGate | None = None) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.bound = bound
        self.scan = START  # where the generated text is, for the digit bound
        self._end = gate.end if gate is not None and not gate.ended else None  # None: the grammar applies
        self._window = tuple(gate.tail) if gate is not None else ()  # the last tokens seen, to find the end in

    @property
    def gated(self) -> bool:
        """The reasoning has not ended yet: no token is refused."""
        return self._end is not None

    @property
    def active(self) -> bool:
        """The grammar decides the next token (not gated, not dead)."""
        return self._end is None and not self.matcher.is_error()

    @property
    def done(self) -> bool:
        return self._end is None and self.matcher.is_stopped()

    @property
    def dead(self) -> bool:
        return self.matcher.is_error()

    @property
    def error(self) -> str:
        return self.matcher.get_error() if self.matcher.is_error() else ""

    def consume(self, token: int) -> bool:
        """Advance over one emitted token; False (and ``dead``) when the grammar refuses it."""
        if self._end is not None:
            self._window, opened = _slide(self._window, token, self._end)
            if opened:
                self._end = None
            return True
        ok = self.matcher.consume_token(token)
        if ok and self.bound is not None:
            self.scan = self.bound.advance(self.scan, token)
        return ok

    def trim(self, draft: Sequence[int]) -> int:
        """How many leading tokens of ``draft`` the grammar (and the digit bound) accepts."""
        free, opens = self._free(draft)
        if free == len(draft):  # the reasoning's own tokens are free (and the draft ends in them)
            return free
        rest = list(draft[free:])
        accepted = self.matcher.validate_tokens(rest) if rest else 0
        if self.bound is None:
            return free + accepted
        state = self.scan
        for n, token in enumerate(rest[:accepted]):
            if token in self.bound.forbidden(state):
                return free + n
            state = self.bound.advance(state, token)
        return free + accepted

    def fill(self, words: Tensor, row: int) -> None:
        """Row ``row`` of the int32 bitmask ``words`` := the tokens allowed next."""
        if self._end is not None:
            words[row].fill_(-1)  # every bit: the reasoning is free
            return
        self._fill_at(words, row, self.scan)

    def _fill_at(self, words: Tensor, row: int, state) -> None:
        _fill(self.matcher, words, row)
        if self.bound is not None:
            self.bound.clear(words[row].numpy(), state)

    def masks_along(self, draft: Sequence[int]) -> np.ndarray:
        """Allowed tokens before each draft token and after the last: bool [len(draft) + 1, vocab]. The draft must
        be accepted whole (``trim`` first); the matcher ends where it started."""
        free, opens = self._free(draft)
        if self._end is None:
            return self._grammar_masks(draft)
        import numpy as np

        allowed = np.ones((len(draft) + 1, self.vocab_size), dtype=bool)  # the reasoning's own tokens are free
        if opens:
            allowed[free:] = self._grammar_masks(draft[free:])
        return allowed

    def _grammar_masks(self, draft: Sequence[int]) -> np.ndarray:
        import torch

        words = torch.empty(len(draft) + 1, _words(self.vocab_size), dtype=torch.int32)
        state = self.scan
        for j in range(len(draft) + 1):
            self._fill_at(words, j, state)
            if j < len(draft):
                self.matcher.consume_token(draft[j])
                if self.bound is not None:
                    state = self.bound.advance(state, draft[j])
        if draft:
            self.matcher.rollback(len(draft))
        return _unpack(words, self.vocab_size)

    def _free(self, draft: Sequence[int]) -> tuple[int, bool]:
        """(how many leading draft tokens are free, whether the reasoning ends with the last of them)."""
        if self._end is None:
            return 0, False
        window = self._window
        for n, token in enumerate(draft):
            window, opened = _slide(window, token, self._end)
            if opened:
                return n + 1, True
        return len(draft), False


def _slide(window: tuple[int, ...], token: int, end: tuple[int, ...]) -> tuple[tuple[int, ...], bool]:
    """The last ``len(end)`` tokens after ``token``, and whether they are ``end``."""
    window = (*window, token)[-len(end):]
    return window, window == end


class Masks:
    """The allowed tokens of a batch's constrained rows, computed on a worker thread from ``start`` on, so they are
    ready when the model's logits are (llguidance and the model call both run without the GIL): the engine starts
    them before a decode call and ``apply``s them after it. Only with a core to spare beyond the model's threads: on a
    machine without one, a third busy thread stalls the model's OpenMP workers for longer than the mask takes
    (~1 ms for 8 rows of a 49k vocabulary), so the mask is computed in ``apply`` instead."""

    def __init__(self, constraints: Sequence[Constraint | None]) -> None:
        self.rows = [i for i, c in enumerate(constraints) if c is not None and c.active]
        self._constraints = [constraints[i] for i in self.rows]
        self._vocab = constraints[self.rows[0]].vocab_size if self.rows else 0
        self._future: Future[np.ndarray] | None = None

    @classmethod
    def start(cls, constraints: Sequence[Constraint | None]) -> Masks:
        masks = cls(constraints)
        if masks.rows and _spare_core():
            masks._future = _worker().submit(masks._compute)
        return masks

    def apply(self, logits: Tensor) -> Tensor:
        """``logits`` [n, vocab] with each constrained row's refused tokens at -inf (a copy when any row is
        constrained; the input itself otherwise). A row whose grammar allows nothing is left as it is."""
        if not self.rows:
            return logits
        allowed = self._future.result() if self._future is not None else self._compute()  # [k, vocab]
        out = copy(logits)
        for k, i in enumerate(self.rows):
            refuse(out[i], allowed[k])
        return out

    def _compute(self) -> np.ndarray:
        import torch

        words = torch.empty(len(self.rows), _words(self._vocab), dtype=torch.int32)
        for k, constraint in enumerate(self._constraints):  # microseconds each
            constraint.fill(words, k)
        return _unpack(words, self._vocab)


def mask_logits(logits: Tensor, constraints: Sequence[Constraint | None]) -> Tensor:
    """``Masks(constraints).apply(logits)`` computed here and now (prefill, tests)."""
    return Masks(constraints).apply(logits)


def copy(logits: Tensor) -> Tensor:
    """A contiguous copy, made by numpy on this thread (see ``refuse``)."""
    import torch

    return torch.from_numpy(logits.numpy().copy())


def refuse(logits: Tensor, allowed: np.ndarray) -> None:
    """Set ``logits`` (float32 [..., vocab], contiguous) to -inf, in place, where ``allowed`` (bool, same shape) is
    False. A row that allows nothing is left alone (its request ends "length"). numpy, one thread: torch's parallel
    masked_fill (and even clone) takes 10-20 ms for 8 x 49k logits when the cores are busy (spinning OpenMP threads),
    numpy a fraction of a millisecond."""
    import numpy as np

    dead = ~allowed.any(axis=-1, keepdims=True)
    np.putmask(logits.numpy(), ~(allowed | dead), np.float32(-np.inf))


def _words(vocab: int) -> int:
    return (vocab + 31) // 32


def _fill(matcher: llguidance.LLMatcher, words: Tensor, row: int) -> None:
    view = words[row]
    matcher.unsafe_compute_mask_ptr(view.data_ptr(), view.numel() * 4)


def _unpack(words: Tensor, vocab: int) -> np.ndarray:
    """int32 bitmask [k, words] (bit b of word w is token 32w + b) -> bool [k, vocab]. numpy's unpackbits over the
    little-endian bytes is the same bit order, and ~20x faster than shifting in torch."""
    import numpy as np

    bits = np.unpackbits(words.numpy().view(np.uint8), axis=-1, bitorder="little")  # [k, 32 * words]
    return bits[:, :vocab].astype(bool)


_WORKER: ThreadPoolExecutor | None = None
_WORKER_LOCK = threading.Lock()


def _spare_core() -> bool:
    import os

    import torch

    return (os.cpu_count() or 1) > torch.get_num_threads()


def _worker() -> ThreadPoolExecutor:
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = ThreadPoolExecutor(1, thread_name_prefix="neuronpack-masks")
        return _WORKER
