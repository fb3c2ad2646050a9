"""Continuous-batching state: a FIFO of waiting sequences and the artifact's fixed batch slots.

Pure bookkeeping (no model calls, no threads), so the policy is testable on its own: a sequence takes a free slot
(the lowest one) when it is prefilled, keeps it while it decodes, and gives it back the moment it finishes or is
aborted. Decode runs the running sequences only (the model packs their slots into the first cache rows).

Parallel sampling (``n`` > 1) shares one prefill: the first sequence of a fork group waits in the queue carrying the
others (``forks``), and the group is admitted only when every member gets a slot at once, so the prompt's KV can be
copied from the leader's slot into the others' right after the leader is prefilled.

Example::

    sched = SlotScheduler(batch_size=4)
    sched.add(seq)
    for seq in sched.admit(limit=1):     # takes a slot
        ...                              # prefill seq.prompt_ids into seq.slot
    slots, tokens, positions = sched.decode_inputs()
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Protocol, TypeVar


class Schedulable(Protocol):
    """What the scheduler needs of a sequence (the engine's ``RequestState``)."""

    request_id: str
    slot: int | None
    forks: list  # same-prompt sequences admitted (and prefilled) together with this one; empty once admitted

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

    def all_sequences(self) -> list[S]:
        """Every unfinished sequence: waiting ones (fork group members included), then running ones."""
        return [m for seq in self.waiting for m in (seq, *seq.forks)] + self.running

    def admit(self, limit: int) -> list[S]:
        """Move up to ``limit`` waiting sequences (FIFO) into free slots and return them (to be prefilled).
        A fork group counts as one and takes all its slots at once (it waits until that many are free)."""
        admitted: list[S] = []
        while self.waiting and len(admitted) < limit and self.free_slots >= 1 + len(self.waiting[0].forks):
            seq = self.waiting.popleft()
            for member in (seq, *seq.forks):
                member.slot = self.slots.index(None)
                self.slots[member.slot] = member
            admitted.append(seq)
        return admitted

    def release(self, seq: S) -> None:
        """Give a finished sequence's slot back."""
        if seq.slot is not None and self.slots[seq.slot] is seq:
            self.slots[seq.slot] = None
        seq.slot = None

    def discard(self, seq: S) -> None:
        """Drop a sequence wherever it is (waiting or holding a slot); nothing happens when it is in neither."""
        self._unqueue(lambda s: s is seq)
        self.release(seq)

    def remove(self, request_id: str) -> S | None:
        """Drop a request wherever it is (waiting or running); returns it, or None when it already finished."""
        if (seq := self._unqueue(lambda s: s.request_id == request_id)) is not None:
            return seq
        for seq in self.running:
            if seq.request_id == request_id:
                self.release(seq)
                return seq
        return None

    def _unqueue(self, match) -> S | None:
        # A waiting leader hands its fork group to the next member; a waiting fork leaves its group.
        for index, seq in enumerate(self.waiting):
            if match(seq):
                del self.waiting[index]
                if seq.forks:
                    leader, leader.forks, seq.forks = seq.forks[0], seq.forks[1:], []
                    self.waiting.insert(index, leader)
                return seq
            for fork in seq.forks:
                if match(fork):
                    seq.forks.remove(fork)
                    return fork
        return None

    def decode_inputs(self) -> tuple[list[int], list[int], list[int]]:
        """(slots, tokens, positions) of the running sequences, in slot order: one decode step's inputs."""
        running = self.running
        return [s.slot for s in running], [s.last_token for s in running], [s.next_position for s in running]
