"""Continuous-batching scheduling: a FIFO of waiting sequences, the compiled batch's KV rows (``RowAllocator``,
kv_rows.py) and the plans of each step (``StepPlan``, plan.py), torch-free and without a model, so the policy is
testable on its own.

A sequence takes the lowest free row when it is admitted (to be prefilled), keeps it while it decodes, and gives it
back the moment it finishes or is aborted; before each phase the allocator packs the running rows into rows
0..n-1 (a decode step runs at the batch of running sequences) and the plan carries the copies that does.

Parallel sampling (``n`` > 1) shares one prefill: the first sequence of a fork group waits in the queue carrying the
others (``forks``), and the group is admitted only when every member gets a row at once, so the prompt's KV can be
copied from the leader's row into the others' right after the leader is prefilled (the plan's ``fork_copies``).

Prefix caching (``prefix_caching``: on in a serving engine, kv_rows.py): a prompt without prompt logprobs takes its
row through ``RowAllocator.allocate_cached``, and its ``PrefillGroup.start`` says from which position it is
prefilled (the positions below hold KV of its prompt's first tokens, copied in by the plan's moves); a sequence that
ends gives its row back with the tokens its KV covers (``cached_tokens``), unless it failed.

Example::

    sched = SlotScheduler(batch_size=4)
    sched.add(seq)
    plan = sched.schedule_prefills(limit=4, token_budget=64)  # seq takes row 0: plan.prefills[0].row == 0
    ...                                      # the runner prefills it, the engine samples its first token
    plan = sched.schedule_decode()           # plan.decodes: one DecodeRow per running sequence, rows 0..n-1
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from neuronpack.runtime.engine.kv_rows import RowAllocator, RowCopy
from neuronpack.runtime.engine.plan import DecodeRow, PrefillGroup, StepPlan


class Schedulable(Protocol):
    """What the scheduler needs of a sequence (the engine's ``RequestState``)."""

    request_id: str
    prompt_ids: Sequence[int]
    adapter: int
    prompt_logprobs: int | None
    forks: list  # same-prompt sequences admitted (and prefilled) together with this one; empty once admitted

    @property
    def last_token(self) -> int: ...

    @property
    def next_position(self) -> int: ...

    @property
    def room(self) -> int: ...  # tokens it may still emit (max_tokens and the model length)

    @property
    def scoring_only(self) -> bool: ...  # max_tokens 0: the prompt is scored, nothing generated

    @property
    def cached_tokens(self) -> Sequence[int]: ...  # the tokens whose KV its row holds (prefix caching only)


S = TypeVar("S", bound=Schedulable)


class SlotScheduler(Generic[S]):
    """Waiting queue + the rows of one compiled batch. ``spec_length``: speculation's draft length (0: none), the
    cap of each decode row's ``num_draft``."""

    def __init__(self, batch_size: int, spec_length: int = 0, cache_rows: int = 0,
                 block_size: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.spec_length = spec_length
        self.waiting: deque[S] = deque()
        self.rows: RowAllocator[S] = RowAllocator(batch_size, cache_rows, block_size)

    @property
    def prefix_caching(self) -> bool:
        return self.rows.caching

    @property
    def running(self) -> list[S]:
        """Sequences holding a row, in row order."""
        return self.rows.owners()

    @property
    def free_rows(self) -> int:
        return self.rows.free

    @property
    def idle(self) -> bool:
        return not self.waiting and self.rows.free == self.batch_size

    def add(self, seq: S) -> None:
        self.waiting.append(seq)

    def at(self, row: int) -> S:
        """The sequence holding ``row``."""
        return self.rows.at(row)

    def all_sequences(self) -> list[S]:
        """Every unfinished sequence: waiting ones (fork group members included), then running ones."""
        return [m for seq in self.waiting for m in (seq, *seq.forks)] + self.running

    # ---- plans ---------------------------------------------------------------------------------------------------
    def schedule_prefills(self, limit: int, token_budget: int | None = None) -> StepPlan:
        """Pack the running rows, then admit up to ``limit`` waiting prompts (FIFO; a fork group counts as one and
        takes all its rows at once, waiting until that many are free) into the lowest free rows. ``token_budget``:
        the prompts after the first are admitted only while the call they share costs at most that many token
        positions (one prefill call pads every prompt to the longest: prompts x longest)."""
        moves = self._compact()
        groups = []
        longest = 0
        while self.waiting and len(groups) < limit and self.rows.free >= 1 + len(self.waiting[0].forks):
            head = self.waiting[0]
            reuse = self.rows.caching and head.prompt_logprobs is None
            uncached = len(head.prompt_ids) - (self.rows.lookup(head.prompt_ids, head.adapter) if reuse else 0)
            cost = (len(groups) + 1) * max(longest, uncached)
            if groups and token_budget is not None and cost > token_budget:
                break
            longest = max(longest, uncached)
            seq = self.waiting.popleft()
            row, start = (self.rows.allocate_cached(seq, seq.prompt_ids, seq.adapter) if reuse
                          else (self.rows.allocate(seq), 0))
            forks, seq.forks = seq.forks, []  # admitted: from now on the members are independent sequences
            copies = tuple(RowCopy(row, self.rows.allocate(f), len(seq.prompt_ids)) for f in forks)
            groups.append(PrefillGroup(seq.request_id, row, seq.prompt_ids, seq.adapter,
                                       own_call=seq.prompt_logprobs is not None, scoring_only=seq.scoring_only,
                                       fork_copies=copies, start=start,
                                       cache_query=reuse))
        return StepPlan(moves=(*moves, *self.rows.take_copies()), prefills=tuple(groups))

    def schedule_decode(self) -> StepPlan:
        """Pack the running rows; one decode row per running sequence, in row order (rows 0..n-1)."""
        moves = self._compact()
        decodes = tuple(DecodeRow(s.request_id, row, s.last_token, s.next_position, s.adapter,
                                  max(0, min(self.spec_length, s.room - 1)) if self.spec_length else 0)
                        for row, s in enumerate(self.rows.owners()))
        return StepPlan(moves=moves, decodes=decodes)

    def _compact(self) -> tuple[RowCopy, ...]:
        # A running sequence's row holds positions 0..next_position-1 (its last token is not cached yet).
        return tuple(self.rows.compact(lambda s: s.next_position))

    # ---- ending sequences ----------------------------------------------------------------------------------------
    def release(self, seq: S, keep: bool = True) -> None:
        """Give a finished sequence's row back; with prefix caching the row keeps its KV for later prompts unless
        ``keep`` is False (a failed sequence: its KV may be garbage)."""
        if self.rows.caching and keep:
            self.rows.release(seq, seq.cached_tokens, seq.adapter)
        else:
            self.rows.release(seq)

    def discard(self, seq: S, keep: bool = True) -> None:
        """Drop a sequence wherever it is (waiting or holding a row); nothing happens when it is in neither."""
        self._unqueue(lambda s: s is seq)
        self.release(seq, keep)

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
