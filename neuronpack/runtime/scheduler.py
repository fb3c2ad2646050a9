"""Continuous-batching state: a FIFO of waiting sequences and the artifact's fixed batch slots.

Pure bookkeeping (no model calls, no threads), so the policy is testable on its own: a sequence takes a free slot
(the lowest one) when it is prefilled, keeps it while it decodes, and gives it back the moment it finishes or is
aborted. Decode always runs the whole compiled batch; idle slots get token 0 at position 0 and their rows are ignored.

Example::

    sched = SlotScheduler(batch_size=4)
    sched.add(seq)
    for seq in sched.admit(limit=1):     # takes a slot
        ...                              # prefill seq.prompt_ids into seq.slot
    tokens, positions = sched.decode_inputs()
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Protocol, TypeVar


class Schedulable(Protocol):
    """What the scheduler needs of a sequence (the engine's ``RequestState``)."""

    request_id: str
    slot: int | None

    @property
    def last_token(self) -> int: ...

    @property
    def next_position(self) -> int: ...


S = TypeVar("S", bound=Schedulable)


class SlotScheduler(Generic[S]):
    """Waiting queue + slot table for one compiled batch."""

    def __init__(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.waiting: deque[S] = deque()
        self.slots: list[S | None] = [None] * batch_size

    @property
    def running(self) -> list[S]:
        """Sequences holding a slot, in slot order."""
        return [s for s in self.slots if s is not None]

    @property
    def free_slots(self) -> int:
        return self.slots.count(None)

    @property
    def idle(self) -> bool:
        return not self.waiting and self.free_slots == self.batch_size

    def add(self, seq: S) -> None:
        self.waiting.append(seq)

    def admit(self, limit: int) -> list[S]:
        """Move up to ``limit`` waiting sequences (FIFO) into free slots and return them (to be prefilled)."""
        admitted: list[S] = []
        while self.waiting and len(admitted) < limit and None in self.slots:
            seq = self.waiting.popleft()
            seq.slot = self.slots.index(None)
            self.slots[seq.slot] = seq
            admitted.append(seq)
        return admitted

    def release(self, seq: S) -> None:
        """Give a finished sequence's slot back."""
        if seq.slot is not None and self.slots[seq.slot] is seq:
            self.slots[seq.slot] = None
        seq.slot = None

    def discard(self, seq: S) -> None:
        """Drop a sequence wherever it is (waiting or holding a slot); nothing happens when it is in neither."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        self.release(seq)

    def remove(self, request_id: str) -> S | None:
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

    def decode_inputs(self) -> tuple[list[int], list[int]]:
        """Per-slot (token, position) for one decode step over the whole batch; idle slots get (0, 0)."""
        tokens = [0] * self.batch_size
        positions = [0] * self.batch_size
        for slot, seq in enumerate(self.slots):
            if seq is not None:
                tokens[slot] = seq.last_token
                positions[slot] = seq.next_position
        return tokens, positions
