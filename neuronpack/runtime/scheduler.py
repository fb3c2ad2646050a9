"""Continuous-batching state: a FIFO of waiting sequences and the artifact's fixed batch slots.

Pure bookkeeping (no model calls, no threads), so the policy is testable on its own: a sequence takes a free slot
(the lowest one) when it is prefilled, keeps it while it decodes, and gives it back the moment it finishes or is
aborted. Decode runs the running sequences only (the model packs their slots into the first cache rows).

Example::

    sched = SlotScheduler(batch_size=4)
    sched.add(seq)
    for seq in sched.admit(limit=1):     # takes a slot
        ...                              # prefill seq.prompt_ids into seq.slot
    slots, tokens, positions = sched.decode_inputs()
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from neuronpack.runtime.sampling import RowSampler
from neuronpack.runtime.stopping import SequenceOutput


@dataclass
class StepOutput:
    """What one request gets after a step: the new token(s) and text, and the finish reason once it ends."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None  # set when the model failed; finish_reason is then "error"


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. ``sink`` receives every StepOutput (called on the engine thread)."""

    request_id: str
    prompt_ids: list[int]
    sampler: RowSampler
    output: SequenceOutput
    sink: Callable[[StepOutput], None]
    arrival: float = field(default_factory=time.monotonic)
    slot: int | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None

    @property
    def last_token(self) -> int:
        return self.output.token_ids[-1]

    @property
    def next_position(self) -> int:
        # The last sampled token is not in the cache yet: it goes at position total_len - 1.
        return self.output.total_len - 1


class SlotScheduler:
    """Waiting queue + slot table for one compiled batch."""

    def __init__(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.waiting: deque[Sequence] = deque()
        self.slots: list[Sequence | None] = [None] * batch_size

    @property
    def running(self) -> list[Sequence]:
        """Sequences holding a slot, in slot order."""
        return [s for s in self.slots if s is not None]

    @property
    def free_slots(self) -> int:
        return self.slots.count(None)

    @property
    def idle(self) -> bool:
        return not self.waiting and self.free_slots == self.batch_size

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self, limit: int) -> list[Sequence]:
        """Move up to ``limit`` waiting sequences (FIFO) into free slots and return them (to be prefilled)."""
        admitted: list[Sequence] = []
        while self.waiting and len(admitted) < limit and None in self.slots:
            seq = self.waiting.popleft()
            seq.slot = self.slots.index(None)
            self.slots[seq.slot] = seq
            admitted.append(seq)
        return admitted

    def release(self, seq: Sequence) -> None:
        """Give a finished sequence's slot back."""
        if seq.slot is not None and self.slots[seq.slot] is seq:
            self.slots[seq.slot] = None
        seq.slot = None

    def remove(self, request_id: str) -> Sequence | None:
        """Drop a request wherever it is (waiting or running); returns it, or None when it already finished."""
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                return seq
        for seq in self.running:
            if seq.request_id == request_id:
                self.release(seq)
                return seq
        return None

    def decode_inputs(self) -> tuple[list[int], list[int], list[int]]:
        """(slots, tokens, positions) of the running sequences, in slot order: one decode step's inputs."""
        running = self.running
        return [s.slot for s in running], [s.last_token for s in running], [s.next_position for s in running]
