"""One request's grammar state while it decodes, and the token masks applied to the logits the sampler sees.

``Constraint`` wraps a request's llguidance matcher: ``consume`` follows each emitted token, ``masks_along`` gives the
allowed tokens at each position of a speculative draft (consuming the draft, then rolling back), ``trim`` cuts a
draft at its first token the grammar refuses. ``mask_logits`` sets every refused token's logit to -inf for the
constrained rows of a batch, so greedy, top-k / top-p, temperature, seeds and logprobs all act on the masked
distribution. Masks of a batch are computed together (llguidance's executor: its own threads, without the GIL).

Example::

    constraint = Constraint(grammar.new_matcher(), vocab_size)
    logits = mask_logits(logits, [constraint, None])     # row 0 constrained, row 1 free
    finished = constraint.consume(token)                 # True once the grammar is complete
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import llguidance
    from torch import Tensor

_EXECUTOR: llguidance.LLExecutor | None = None


class Constraint:
    """A request's grammar matcher. ``done``: the grammar is complete (nothing more may follow); ``dead``: the
    matcher failed (a refused token or a dead end), the request ends with "length"."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size

    @property
    def done(self) -> bool:
        return self.matcher.is_stopped()

    @property
    def dead(self) -> bool:
        return self.matcher.is_error()

    @property
    def error(self) -> str:
        return self.matcher.get_error() if self.matcher.is_error() else ""

    def consume(self, token: int) -> bool:
        """Advance over one emitted token; False (and ``dead``) when the grammar refuses it."""
        return self.matcher.consume_token(token)

    def trim(self, draft: Sequence[int]) -> int:
        """How many leading tokens of ``draft`` the grammar accepts."""
        return self.matcher.validate_tokens(list(draft)) if draft else 0

    def masks_along(self, draft: Sequence[int]) -> Tensor:
        """Allowed tokens before each draft token and after the last: bool [len(draft) + 1, vocab]. The draft must
        be accepted whole (``trim`` first); the matcher ends where it started."""
        import torch

        words = torch.empty(len(draft) + 1, _words(self.vocab_size), dtype=torch.int32)
        for j in range(len(draft) + 1):
            _fill(self.matcher, words, j)
            if j < len(draft):
                self.matcher.consume_token(draft[j])
        if draft:
            self.matcher.rollback(len(draft))
        return _unpack(words, self.vocab_size)


def mask_logits(logits: Tensor, constraints: Sequence[Constraint | None]) -> Tensor:
    """``logits`` [n, vocab] with each constrained row's refused tokens at -inf (a copy when any row is constrained;
    the input itself otherwise). A row whose grammar allows nothing is left as it is: its request ends "length"."""
    rows = [i for i, c in enumerate(constraints) if c is not None and not c.dead]
    if not rows:
        return logits
    import torch

    vocab = logits.shape[-1]
    words = torch.empty(len(rows), _words(vocab), dtype=torch.int32)
    _executor().unsafe_compute_mask_ptr([(constraints[i].matcher, k) for k, i in enumerate(rows)],
                                        words.data_ptr(), words.shape[1] * 4, len(rows))
    allowed = _unpack(words, vocab)  # [k, vocab]
    allowed |= ~allowed.any(dim=-1, keepdim=True)  # nothing allowed: leave the row alone (it ends "length")
    out = logits.clone()
    index = torch.tensor(rows)
    out[index] = out[index].masked_fill(~allowed, float("-inf"))
    return out


def _words(vocab: int) -> int:
    return (vocab + 31) // 32


def _fill(matcher: llguidance.LLMatcher, words: Tensor, row: int) -> None:
    view = words[row]
    matcher.unsafe_compute_mask_ptr(view.data_ptr(), view.numel() * 4)


def _unpack(words: Tensor, vocab: int) -> Tensor:
    """int32 bitmask [k, words] (bit b of word w is token 32w + b) -> bool [k, vocab]."""
    import torch

    shifts = torch.arange(32, dtype=torch.int32)
    bits = (words[:, :, None] >> shifts) & 1  # [k, words, 32]
    return bits.reshape(words.shape[0], -1)[:, :vocab].bool()


def _executor() -> llguidance.LLExecutor:
    global _EXECUTOR
    if _EXECUTOR is None:
        import llguidance

        _EXECUTOR = llguidance.LLExecutor(num_threads=2)
    return _EXECUTOR
