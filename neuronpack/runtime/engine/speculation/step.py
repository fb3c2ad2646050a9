"""One draft-then-verify step over the running sequences (continuous batching: every sequence in a KV row joins).

1. Each sequence asks the proposer for up to ``num_draft`` drafts (the scheduler's plan: ``length`` capped by its
   room, never a token past ``max_model_len`` nor more than its max_tokens can still take, as the target adds one
   token of its own), in its own KV row (the proposer drafts in the same rows as the target).
2. One ``verify`` call scores every sequence's ``[last, *drafts]`` at its own cache position, rows right padded to
   T = 1 + the longest draft (padding repeats the last token; its logits are ignored and its KV is overwritten
   later). When no sequence has a draft the step is a plain ``decode`` call, so speculation costs nothing when the
   proposer has no guess.
3. A sequence with a grammar (constrained decoding) has its draft cut at the first token the grammar refuses, and
   its logits at every verified position masked to what the grammar allows after the drafts before it (the matcher
   walks the draft and rolls back), so acceptance only ever keeps or emits tokens the grammar allows.
4. ``acceptance.accept`` keeps drafts and adds the target's token; positions advance by kept + 1 (the engine's
   ``next_position`` follows from the emitted tokens).

The engine keeps sequences below ``max_model_len - length`` (its stop rules' ``lookahead``), so ``starts + T`` never
passes the cache.

Example::

    step = SpeculativeStep(model, PromptLookupProposer(2, 4), length=4)
    outcomes, stats = step.run(rows)            # rows: [SpecRow]; outcomes[i].token_ids: 1..5 tokens
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from neuronpack.runtime.engine.sampling import RowSampler
from neuronpack.runtime.engine.speculation.acceptance import Accepted, accept
from neuronpack.runtime.engine.speculation.proposer import Draft, DraftRequest, Proposer
from neuronpack.runtime.engine.speculation.stats import SpecStats
from neuronpack.runtime.structured.matcher import Constraint, copy, refuse

if TYPE_CHECKING:
    from torch import Tensor


class VerifyingModel(Protocol):
    """What the step drives (``neuronpack.backends.torch_aot.CompiledLM``)."""

    max_verify_tokens: int

    def decode(self, tokens: Tensor, positions: Tensor, slots: Sequence[int] | None = None) -> Tensor: ...

    def verify(self, slots: Sequence[int], token_rows: Sequence[Sequence[int]], starts: Sequence[int]) -> Tensor: ...

    def verify_hidden(self, slots: Sequence[int], token_rows: Sequence[Sequence[int]], starts: Sequence[int],
                      hidden_layers: Sequence[int] | None = None) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class SpecRow:
    """One running sequence: its KV row, the cache position of its last token (not cached yet), its tokens so far
    (prompt + output, the last one included), the most drafts it may verify (``DecodeRow.num_draft``), and its
    sampler."""

    request_id: str
    row: int
    start: int
    token_ids: Sequence[int]
    num_draft: int
    sampler: RowSampler
    constraint: Constraint | None = None


class SpeculativeStep:
    """Drafts with ``proposer`` (at most ``length`` per sequence), verifies with ``model``."""

    def __init__(self, model: VerifyingModel, proposer: Proposer, length: int) -> None:
        if length + 1 > model.max_verify_tokens:
            raise ValueError(f"speculation length {length} needs {length + 1} tokens per verify call; the artifact's "
                             f"graphs take at most {model.max_verify_tokens}")
        self.model, self.proposer, self.length = model, proposer, length

    def run(self, rows: Sequence[SpecRow]) -> tuple[list[Accepted], SpecStats]:
        """Draft, verify and accept for every row; returns each row's outcome and the step's counts."""
        import torch

        requests = [DraftRequest(r.request_id, r.token_ids, min(self.length, r.num_draft), r.row) for r in rows]
        drafts = [Draft(d.token_ids[: q.max_tokens], d.probs) for d, q in
                  zip(self.proposer.propose(requests), requests, strict=True)]
        drafts = [d if r.constraint is None else Draft(d.token_ids[: r.constraint.trim(d.token_ids)], d.probs)
                  for r, d in zip(rows, drafts, strict=True)]
        width = 1 + max(len(d.token_ids) for d in drafts)
        slots = [r.row for r in rows]
        hidden = None
        if width == 1 and not self.proposer.needs_hidden_states:
            tokens = torch.tensor([r.token_ids[-1] for r in rows])
            logits = self.model.decode(tokens, torch.tensor([r.start for r in rows]), slots)[:, None]  # [n, 1, V]
        else:
            token_rows = [_padded([r.token_ids[-1], *d.token_ids], width) for r, d in zip(rows, drafts, strict=True)]
            starts = [r.start for r in rows]
            if self.proposer.needs_hidden_states:
                logits, hidden = self.model.verify_hidden(slots, token_rows, starts, self.proposer.hidden_layers)
            else:
                logits = self.model.verify(slots, token_rows, starts)  # [n, width, V]
        logits = _masked(logits, rows, drafts)
        outcomes = accept(logits, drafts, [r.sampler for r in rows])
        self.proposer.verified([r.request_id for r in rows], [o.num_accepted for o in outcomes], hidden)
        stats = SpecStats.new(self.length)
        for outcome in outcomes:
            stats.observe(outcome.num_draft, outcome.num_accepted)
        return outcomes, stats


def _masked(logits: Tensor, rows: Sequence[SpecRow], drafts: Sequence[Draft]) -> Tensor:
    """logits [n, T, vocab] with each constrained row's positions 0..len(draft) masked to its grammar."""
    if all(r.constraint is None or r.constraint.dead for r in rows):
        return logits
    logits = copy(logits)
    for i, (row, draft) in enumerate(zip(rows, drafts, strict=True)):
        if row.constraint is not None and not row.constraint.dead:
            allowed = row.constraint.masks_along(draft.token_ids)  # [m + 1, vocab]
            refuse(logits[i, : allowed.shape[0]], allowed)
    return logits


def _padded(tokens: list[int], width: int) -> list[int]:
    return tokens + [tokens[-1]] * (width - len(tokens))
