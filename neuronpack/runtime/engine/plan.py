"""What the scheduler decides for one phase of a step, as data (torch-free): ``StepPlan``.

The engine's step is vLLM v1's schedule / execute / update split, twice: the scheduler plans the prefills
(``SlotScheduler.schedule_prefills``), the runner executes the plan against the compiled model (runner.py), the
engine applies the outputs (sampling, stop rules, streaming); then the same for one decode step over every running
sequence (``SlotScheduler.schedule_decode``), planned after the prefills' first tokens are applied because a
sequence may end there and free its row. A plan names rows, never tensors: the runner is the only place they meet.

Example::

    plan = scheduler.schedule_prefills(limit=1)
    plan.moves        # (RowCopy(src=3, dst=1, length=40),): apply before any model call
    plan.prefills     # (PrefillGroup(request_id="r7", row=3, prompt_ids=[...], fork_copies=(RowCopy(3, 4, 12),)),)
    plan.prefills[0].tokens   # the chunk this step prefills (positions start..stop-1; all of a short prompt)
    plan = scheduler.schedule_decode()
    plan.decodes      # (DecodeRow("r1", row=0, token=42, position=17, num_draft=4), ...): adjacent rows, in order
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from neuronpack.runtime.engine.kv_rows import Move, RowCopy


@dataclass(frozen=True)
class PrefillGroup:
    """One prompt to prefill into ``row``; with parallel sampling its forks' rows get the prompt's KV afterwards
    (``fork_copies``, one per fork, in the order of ``fork_rows``). ``own_call``: the prompt needs every position's
    logits (prompt logprobs) and takes its own call; the others share one. ``scoring_only``: max_tokens 0, nothing
    is sampled (and the fork copies are not applied: the forks only share the leader's prompt logprobs).
    ``start``: the first position to prefill (prefix caching: the positions below already hold the prompt's KV,
    copied in by the plan's moves, or earlier chunks wrote them) and ``end`` the position after the last (None: the
    prompt's end): a long prompt is prefilled in chunks over several steps, between decode steps (chunked prefill),
    and only its last chunk (``done``) yields its first token; ``first``: its first chunk. ``cache_query``: the
    prompt was looked up in the prefix cache (what the hit-rate counters count)."""

    request_id: str
    row: int
    prompt_ids: Sequence[int]
    adapter: int = 0
    own_call: bool = False
    scoring_only: bool = False
    fork_copies: tuple[RowCopy, ...] = ()
    start: int = 0
    cache_query: bool = False
    end: int | None = None
    first: bool = True

    @property
    def stop(self) -> int:
        """The position after the chunk's last."""
        return len(self.prompt_ids) if self.end is None else self.end

    @property
    def tokens(self) -> Sequence[int]:
        """The chunk's tokens: positions start..stop-1 of the prompt."""
        return self.prompt_ids[self.start:self.stop]

    @property
    def done(self) -> bool:
        """The chunk ends the prompt: its logits are the first token's."""
        return self.stop == len(self.prompt_ids)

    @property
    def rows(self) -> tuple[int, ...]:
        """The group's rows: the leader's, then each fork's."""
        return (self.row, *(c.dst for c in self.fork_copies))


@dataclass(frozen=True)
class DecodeRow:
    """One running sequence in a decode step: its row, its last sampled token (not cached yet) and that token's
    position; ``num_draft``: with speculation, the most draft tokens it may verify this step (its room minus the
    target's own token, capped by the speculation length; 0 without speculation)."""

    request_id: str
    row: int
    token: int
    position: int
    adapter: int = 0
    num_draft: int = 0


@dataclass(frozen=True)
class StepPlan:
    """One phase of a step: row moves to apply first (compaction after sequences ended), then the prefills or the
    decode rows (one window of adjacent rows, in row order)."""

    moves: tuple[Move, ...] = ()
    prefills: tuple[PrefillGroup, ...] = ()
    decodes: tuple[DecodeRow, ...] = ()
