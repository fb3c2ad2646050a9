"""Continuous-batching scheduling: a FIFO of waiting sequences, the compiled batch's KV rows (``RowAllocator``,
kv_rows.py) and the plans of each step (``StepPlan``, plan.py), torch-free and without a model, so the policy is
testable on its own.

A sequence takes a free row when it is admitted (``RowAllocator``: the one holding its longest cached prefix, else
the least recently used), keeps it while its prompt is prefilled chunk by chunk (``prefilling``: as many of its
tokens a step as the step's token budget leaves, at most ``max_chunk``) and while it decodes, and gives it back the
moment it finishes or is aborted; before each decode step the allocator packs the decoding rows into one window of
adjacent rows (the decode graph runs on them) and the plan carries the moves that do it.

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
    plan = sched.schedule_prefills(token_budget=sched.prefill_budget(64))  # seq's first chunk in its row
    ...                                      # the runner prefills it, the engine samples its first token
    plan = sched.schedule_decode()           # plan.decodes: one DecodeRow per decoding sequence, adjacent rows
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from neuronpack.runtime.engine.kv_rows import Move, RowAllocator, RowCopy
from neuronpack.runtime.engine.plan import DecodeRow, PrefillGroup, StepPlan


class Schedulable(Protocol):
    """What the scheduler needs of a sequence (the engine's ``RequestState``)."""

    request_id: str
    prompt_ids: Sequence[int]
    adapter: int
    prompt_logprobs: int | None
    forks: list  # same-prompt sequences admitted (and prefilled) together with this one; empty once admitted
    num_cached_tokens: int  # set on admission: prompt tokens whose KV the prefix cache supplied

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


@dataclass(eq=False)
class Prefilling(Generic[S]):
    """A sequence admitted and holding its row whose prompt is not all prefilled yet: ``computed`` positions of its
    row hold the prompt's KV (cached or prefilled by earlier chunks); ``forks`` (holding rows of their own) get the
    prompt's KV after its last chunk, copied from wherever the rows are then; ``cache_query``: it was looked up in the
    prefix cache."""

    seq: S
    computed: int
    forks: tuple[S, ...] = ()
    cache_query: bool = False
    first: bool = True  # no chunk of it has been planned yet


class SlotScheduler(Generic[S]):
    """Waiting queue + the rows of one compiled batch + the prompts being prefilled chunk by chunk.
    ``spec_length``: speculation's draft length (0: none), the cap of each decode row's ``num_draft``;
    ``max_chunk``: the most prompt tokens of one sequence one prefill call takes (the largest context bucket; None:
    any); ``window``: the model's sliding-window layers keep only that many positions per row (``RowAllocator``)."""

    def __init__(self, batch_size: int, spec_length: int = 0, cache_blocks: int = 0,
                 block_size: int | None = None, max_chunk: int | None = None, window: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.spec_length = spec_length
        self.max_chunk = max_chunk
        self.waiting: deque[S] = deque()
        self.prefilling: list[Prefilling[S]] = []  # admission order
        self.rows: RowAllocator[S] = RowAllocator(batch_size, cache_blocks, block_size, window)

    @property
    def prefix_caching(self) -> bool:
        return self.rows.caching

    @property
    def running(self) -> list[S]:
        """Sequences holding a row (decoding or being prefilled), in row order."""
        return self.rows.owners()

    @property
    def decoding(self) -> list[S]:
        """Sequences holding a row whose prompt is prefilled (what a decode step runs), in row order."""
        busy = {id(m) for p in self.prefilling for m in (p.seq, *p.forks)}
        return [s for s in self.rows.owners() if id(s) not in busy]

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

    def prefill_budget(self, max_num_batched_tokens: int | None) -> int | None:
        """Prompt token positions this step's prefill calls may take: what the step's budget leaves after the decode
        step's tokens (one per decoding sequence, k + 1 speculating), at least one; with nothing decoding, no stream
        waits on the prefill: one chunk (``max_chunk``) or the budget, whichever is larger. None: unbounded."""
        if max_num_batched_tokens is None:
            return None
        decoding = len(self.decoding)
        if not decoding:
            return max(max_num_batched_tokens, self.max_chunk or 0)
        return max(1, max_num_batched_tokens - decoding * (1 + self.spec_length))

    # ---- plans ---------------------------------------------------------------------------------------------------
    def schedule_prefills(self, limit: int | None = None, token_budget: int | None = None) -> StepPlan:
        """The chunks of the prompts being prefilled that finish within ``token_budget``, then up to ``limit``
        waiting prompts admitted (FIFO; a fork group counts as one and takes all its rows at once, waiting until
        that many are free) into free rows (``RowAllocator``: the row holding their longest cached prefix, else the
        least recently used), each with its first chunk, then the next chunks of the longer prompts being
        prefilled (oldest first), while the calls cost at most ``token_budget`` token positions (the prompts share
        one call padded to the longest chunk: chunks x the longest; the first chunk is cut to the budget, the others
        to the longest so far). A chunk is at most ``max_chunk`` tokens."""
        groups: list[PrefillGroup] = []
        width = 0

        def chunk(remaining: int) -> int:
            want = remaining if self.max_chunk is None else min(remaining, self.max_chunk)
            n = len(groups) + 1
            if token_budget is None or n * max(width, want) <= token_budget:
                return want
            if not groups:
                return min(want, token_budget)
            return min(want, width) if n * width <= token_budget else 0

        def remaining(p: Prefilling[S]) -> int:
            return len(p.seq.prompt_ids) - p.computed

        def continue_chunks(prefilling: list[Prefilling[S]]) -> None:
            nonlocal width
            for progress in prefilling:
                if not (take := chunk(remaining(progress))):
                    break
                groups.append(self._chunk(progress, take))
                width = max(width, take)

        # Prompts that finish within this step's budget go first, then new ones, then the longer ones: a chat's
        # short prompt is not queued behind a long document's every chunk (new prompts need a free row, so the
        # long ones get the budget back whenever the rows are full).
        short = [p for p in self.prefilling if token_budget is None or remaining(p) <= token_budget]
        long = [p for p in self.prefilling if p not in short]
        continue_chunks(short)
        admitted = 0
        while self.waiting and (limit is None or admitted < limit) \
                and self.rows.free >= 1 + len(self.waiting[0].forks):
            head = self.waiting[0]
            reuse = self.rows.caching and head.prompt_logprobs is None
            take = chunk(len(head.prompt_ids) - (self.rows.lookup(head.prompt_ids, head.adapter) if reuse else 0))
            if not take:
                break
            seq = self.waiting.popleft()
            row, start = (self.rows.allocate_cached(seq, seq.prompt_ids, seq.adapter) if reuse
                          else (self.rows.allocate(seq), 0))
            seq.num_cached_tokens = start
            forks, seq.forks = seq.forks, []  # admitted: from now on the members are independent sequences
            for fork in forks:
                self.rows.allocate(fork)
            progress = Prefilling(seq, start, tuple(forks), reuse)
            self.prefilling.append(progress)
            groups.append(self._chunk(progress, take))
            width = max(width, take)
            admitted += 1
        continue_chunks(long)
        self.prefilling = [p for p in self.prefilling if p.computed < len(p.seq.prompt_ids)]
        return StepPlan(moves=tuple(self.rows.take_copies()), prefills=tuple(groups))

    def _chunk(self, progress: Prefilling[S], take: int) -> PrefillGroup:
        seq, start = progress.seq, progress.computed
        progress.computed += take
        last = progress.computed == len(seq.prompt_ids)
        row = self.rows.row(seq)
        copies = tuple(RowCopy(row, self.rows.row(f), len(seq.prompt_ids))  # type: ignore[arg-type]
                       for f in progress.forks) if last else ()
        group = PrefillGroup(seq.request_id, row, seq.prompt_ids, seq.adapter,  # type: ignore[arg-type]
                             own_call=seq.prompt_logprobs is not None, scoring_only=seq.scoring_only,
                             fork_copies=copies, start=start,
                             end=None if last else progress.computed,
                             cache_query=progress.cache_query, first=progress.first)
        progress.first = False
        return group

    def schedule_decode(self, skip: Collection[str] = ()) -> StepPlan:
        """Pack the decoding rows into one window; one decode row per decoding sequence, in row order. ``skip``:
        request ids that do not decode this step (prompts whose last chunk ran in it: the step's token budget did
        not count them)."""
        decoding = [s for s in self.decoding if s.request_id not in skip]
        moves = self._compact(decoding)
        decodes = tuple(DecodeRow(s.request_id, self.rows.row(s), s.last_token, s.next_position,  # type: ignore[arg-type]
                                  s.adapter,
                                  max(0, min(self.spec_length, s.room - 1)) if self.spec_length else 0)
                        for s in sorted(decoding, key=self.rows.row))  # type: ignore[arg-type]
        return StepPlan(moves=moves, decodes=decodes)

    def _compact(self, decoding: list[S]) -> tuple[Move, ...]:
        # A sequence being prefilled holds what its chunks wrote; a fork waiting for its leader's prompt holds
        # nothing yet; any other holds positions 0..next_position-1 (its last token is not cached yet).
        computed = {id(p.seq): p.computed for p in self.prefilling}
        computed |= {id(f): 0 for p in self.prefilling for f in p.forks}

        def length(s: S) -> int:
            return computed.get(id(s), s.next_position)

        return tuple(self.rows.compact(length, set(decoding)))

    # ---- ending sequences ----------------------------------------------------------------------------------------
    def release(self, seq: S, keep: bool = True) -> None:
        """Give a finished sequence's row back; with prefix caching the row keeps its KV for later prompts unless
        ``keep`` is False (a failed sequence: its KV may be garbage)."""
        self._unprefill(seq)
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

    def _unprefill(self, seq: S) -> None:
        """``seq`` ends: a prompt being prefilled stops; a fork waiting for it becomes the leader of the rest and is
        prefilled from its own row's start."""
        for index, progress in enumerate(self.prefilling):
            if progress.seq is seq:
                del self.prefilling[index]
                if progress.forks:
                    self.prefilling.insert(index, Prefilling(progress.forks[0], 0, progress.forks[1:]))
                return
            if any(f is seq for f in progress.forks):
                progress.forks = tuple(f for f in progress.forks if f is not seq)
                return

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
