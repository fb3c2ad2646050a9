"""Speculation counts, as vLLM's spec_decode metrics define them (vllm/v1/spec_decode/metrics.py).

A "draft" is one sequence's proposal in one step that had at least one token; sequences without a guess in a step
add nothing. acceptance rate = accepted / drafted tokens; mean acceptance length = 1 + accepted / drafts (the
target's own token of each step included, as vLLM reports it).

Example::

    stats = SpecStats.new(length=4)
    stats.observe(num_draft=4, num_accepted=2)
    stats.acceptance_rate, stats.mean_acceptance_length      # 0.5, 3.0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecStats:
    """Counts over some steps (one request's, or one engine step's). ``steps``: verify steps the sequence(s) took
    part in (with or without a draft), ``tokens``: tokens those steps emitted."""

    length: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    steps: int = 0
    tokens: int = 0

    @classmethod
    def new(cls, length: int) -> SpecStats:
        return cls(length=length, num_accepted_tokens_per_pos=[0] * length)

    def observe(self, num_draft: int, num_accepted: int, emitted: int | None = None) -> None:
        """One sequence's step: drafts proposed and kept, tokens emitted (default: kept + the target's one)."""
        if not 0 <= num_accepted <= num_draft <= self.length:
            raise ValueError(f"{num_accepted} accepted of {num_draft} drafts (length {self.length})")
        self.steps += 1
        self.tokens += num_accepted + 1 if emitted is None else emitted
        if num_draft == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            self.num_accepted_tokens_per_pos[pos] += 1

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def tokens_per_step(self) -> float | None:
        return self.tokens / self.steps if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (what ``generate --format json`` reports under "speculation")."""
        return {
            "length": self.length, "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length,
            "steps": self.steps, "tokens_per_step": self.tokens_per_step,
        }
