"""Draft proposers: who guesses the next tokens before the target verifies them.

A proposer gets, for every running sequence, its token ids (prompt + output; the last one is not in the KV cache
yet) and how many drafts it may return at most, and answers a ``Draft`` per sequence (possibly empty). Drafts that
come from a distribution (a sampling draft model) carry it as ``probs`` [len, vocab] so rejection sampling can
compare; deterministic drafts (prompt lookup, greedy drafts) leave it None: a one-hot distribution.

``PromptLookupProposer`` is vLLM's ``ngram`` method: find the longest n-gram (``min_n``..``max_n`` tokens) that ends
the sequence and also occurs earlier in it, take its earliest occurrence, and propose the tokens that followed it.
It needs no model and no torch.

Example::

    proposer = PromptLookupProposer(min_n=2, max_n=3)
    proposer.propose([DraftRequest("r1", [1, 2, 3, 4, 2, 3], max_tokens=4)])[0].token_ids   # [4, 2, 3]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class DraftRequest:
    """One running sequence asking for drafts: its ids so far, the most drafts it may take (room left) and its KV
    row (the scheduler's ``RowAllocator``: a draft model keeps its own KV in the target's rows)."""

    request_id: str
    token_ids: Sequence[int]
    max_tokens: int
    row: int = 0


@dataclass(frozen=True)
class Draft:
    """Proposed tokens; ``probs`` [len(token_ids), vocab] the distribution each was drawn from (None: one-hot)."""

    token_ids: list[int]
    probs: Tensor | None = None


class Proposer(Protocol):
    """What the speculative step drives. ``needs_hidden_states``: the verify call must return the target's hidden
    states (EAGLE drafts read them), handed to ``verified``; ``hidden_layers``: which ones (None: the final-normed
    states; else the concatenated inputs of these target layers, EAGLE-3's)."""

    needs_hidden_states: bool
    hidden_layers: tuple[int, ...] | None

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        """One Draft per request, at most ``max_tokens`` tokens each (empty when there is no guess)."""
        ...

    def prefilled(self, request_ids: Sequence[str], hidden: Sequence[Tensor]) -> None:
        """Called after a prefill when ``needs_hidden_states``: each prompt's target hidden states [len, H]."""
        ...

    def verified(self, request_ids: Sequence[str], accepted: Sequence[int], hidden: Tensor | None) -> None:
        """After verification: how many drafts each request accepted, and the target's hidden states
        [n, T, hidden_size] when ``needs_hidden_states`` (else None)."""
        ...

    def copy_rows(self, copies: Sequence[tuple[int, int, int]]) -> None:
        """The scheduler moved sequences between rows: ``(src, dst, length)`` copies of the target's cache
        positions, to apply to a draft cache kept in the same rows (nothing to do without one)."""
        ...


class PromptLookupProposer:
    """N-gram lookup in the sequence's own tokens (vLLM's ``ngram`` speculative method); stateless."""

    needs_hidden_states = False
    hidden_layers = None

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt lookup needs 1 <= min_n <= max_n, got {min_n} and {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        return [Draft(lookup_draft(r.token_ids, self.min_n, self.max_n, r.max_tokens)) for r in requests]

    def prefilled(self, request_ids: Sequence[str], hidden: Sequence[Tensor]) -> None:
        return None

    def verified(self, request_ids: Sequence[str], accepted: Sequence[int], hidden: Tensor | None) -> None:
        return None

    def copy_rows(self, copies: Sequence[tuple[int, int, int]]) -> None:
        return None


def lookup_draft(token_ids: Sequence[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The tokens that followed the earliest earlier occurrence of the longest suffix n-gram (min_n <= n <= max_n),
    at most ``k`` of them; [] when no such n-gram occurs. The same choice as vLLM's ngram proposer.

    Example: ``lookup_draft([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]`` (the suffix [2, 3] occurs at index 1).
    """
    ids = list(token_ids)
    total = len(ids)
    if k <= 0 or total < min_n:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        start = _earliest(ids, ids[total - n :], total - n)
        if start is not None:
            begin = start + n  # the tokens after the match; it may overlap the suffix itself
            return ids[begin : begin + k]
    return []


def _earliest(ids: list[int], pattern: list[int], end: int) -> int | None:
    """The first i < end with ids[i:i+len(pattern)] == pattern (list.index finds candidates at C speed)."""
    first, n, i = pattern[0], len(pattern), 0
    while True:
        try:
            i = ids.index(first, i, end)
        except ValueError:
            return None
        if ids[i : i + n] == pattern:
            return i
        i += 1
