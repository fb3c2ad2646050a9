"""Continuous-batching state: a FIFO of waiting sequences and the artifact's fixed batch slots.

Pure bookkeeping (no model calls, no threads), so the policy is testable on its own: a sequence takes a free slot
(the lowest one) when it is prefilled, keeps it while it decodes, and gives it back the moment it finishes or is
aborted. Decode always runs the whole compiled batch; idle slots get token 0 at position 0 and their rows are ignored.

Parallel sampling (``n`` > 1) shares one prefill: the first sequence of a fork group waits in the queue carrying the
others (``forks``), and the group is admitted only when every member gets a slot at once, so the prompt's KV can be
copied from the leader's slot into the others' right after the leader is prefilled.

Example::

    sched = SlotScheduler(batch_size=4)
    sched.add(seq)
    for seq in sched.admit(limit=1):     # takes a slot
        ...                              # prefill seq.prompt_ids into seq.slot
    tokens, positions = sched.decode_inputs()
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from neuronpack.runtime.logprobs import TokenLogprobs
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
    logprobs: list[TokenLogprobs] | None = None  # one per token in token_ids, when the request asked for them
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # on the first output only, when asked for
    stop_reason: str | int | None = None  # the stop string / stop token id that ended the request


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
    prompt_logprobs: int | None = None  # top-N for prompt logprobs (echo), None when not asked for
    forks: list[Sequence] = field(default_factory=list)  # n > 1: same prompt, prefilled once with this one

    @property
    def group_size(self) -> int:
        return 1 + len(self.forks)

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

    def all_sequences(self) -> list[Sequence]:
        """Every unfinished sequence: waiting ones (fork group members included), then running ones."""
        return [m for seq in self.waiting for m in (seq, *seq.forks)] + self.running

    def admit(self, limit: int) -> list[Sequence]:
        """Move up to ``limit`` waiting sequences (FIFO) into free slots and return them (to be prefilled).
        A fork group counts as one and takes all its slots at once (it waits until that many are free)."""
        admitted: list[Sequence] = []
        while self.waiting and len(admitted) < limit and self.free_slots >= self.waiting[0].group_size:
            seq = self.waiting.popleft()
            for member in (seq, *seq.forks):
                member.slot = self.slots.index(None)
                self.slots[member.slot] = member
            admitted.append(seq)
        return admitted

    def release(self, seq: Sequence) -> None:
        """Give a finished sequence's slot back."""
        if seq.slot is not None and self.slots[seq.slot] is seq:
            self.slots[seq.slot] = None
        seq.slot = None

    def remove(self, request_id: str) -> Sequence | None:
        """Drop a request wherever it is (waiting or running); returns it, or None when it already finished."""
        for index, seq in enumerate(self.waiting):
            if seq.request_id == request_id:
                del self.waiting[index]
                if seq.forks:  # the next member leads the group now
                    leader, leader.forks, seq.forks = seq.forks[0], seq.forks[1:], []
                    self.waiting.insert(index, leader)
                return seq
            for fork in seq.forks:
                if fork.request_id == request_id:
                    seq.forks.remove(fork)
                    return fork
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
