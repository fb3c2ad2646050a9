"""The one owner of KV-cache rows: which sequence holds which row of the compiled batch, for the target model and
its draft alike, which free rows keep cached prefixes, and the block pool beyond the batch (torch-free).

A decode step over n sequences runs on n adjacent cache rows (the graphs read the views ``cache[w:w+n]``:
contiguous, no copy), so the rows of the decoding sequences must form one window. ``compact`` picks the window that
costs the fewest copied positions and moves the decoding sequences outside it into it: into an empty row with a
``RowCopy``, or, when the row it takes keeps a cached prefix (or holds a sequence still being prefilled), with a
``RowSwap`` that moves that content into the row the sequence leaves, so packing never drops a prefix. The copies are
data: the scheduler puts them into its ``StepPlan``, the runner applies them to the target's KV cache and the EAGLE
draft's, before the step's model calls. Parallel sampling (n > 1) shares a prompt's prefill the same way:
``RowCopy(leader's row, fork's row, prompt length)`` after the leader's prefill.

Prefix caching (vLLM's automatic prefix caching): a released row keeps its KV and the tokens it holds
(``release(owner, tokens, salt)``; the salt is the LoRA adapter, which changes every position's KV), and stays so
while other rows are free: a new sequence takes the free row holding the longest prefix of its prompt (found by
chained block hashes, prefix_cache.py), else the least recently used free row (empty rows first). Before a free row
that keeps a prefix is overwritten, its full blocks are saved into the ``BlockPool`` beyond the batch
(kv_blocks.py: ``cache_blocks`` blocks of ``block_size`` positions, prefixes sharing blocks share them; a
``BlockCopy`` to the pool), evicting the least recently used blocks, or dropped when they are the least recently
used themselves. A prompt whose longest cached prefix is in the pool gets those blocks copied into its row (a
``BlockCopy`` from the pool, after what its row holds already; a ``BlockExchange`` when the row's old prefix is saved
into the blocks being read), and the pool's copy of what the row now holds goes first when room is needed
(``BlockPool.demote``); a row taken in place saves what it kept beyond the new prompt's prefix only into free room
when most of it is that prefix. Memory stays bounded by size rows + cache_blocks blocks whatever is cached.

A model whose sliding-window layers keep only their window (``window``: a ring of the last positions per row, the
torch backend's ``kv_ring``) has no pool (prefix_cache.py) and reuses a free row's prefix only where the ring still
holds the window below the first uncached position: a prompt continuing the row's whole conversation, or a row
whose sequence never passed the window (``_ring_keeps``).

Nothing else tracks rows: the model's KV cache is addressed by row (and pool block) and only applies the copies it
is given; the EAGLE proposer keeps its draft KV in the same rows (an EAGLE engine caches no prefix, so it only ever
sees ``RowCopy`` moves).

Example::

    rows = RowAllocator(4)
    a, b, c = "a", "b", "c"
    rows.allocate(a), rows.allocate(b), rows.allocate(c)     # (0, 1, 2)
    rows.release(b)                                          # rows 0 and 2 are no window
    rows.compact({a: 7, c: 12}.__getitem__)                  # [RowCopy(src=0, dst=1, length=7)]: a moves up
    rows.row(a), rows.owners()                               # (1, ['a', 'c'])

    cached = RowAllocator(2, cache_blocks=4, block_size=4)
    cached.allocate("x"); cached.release("x", tokens=list(range(10)), salt=0)   # row 0 keeps 10 tokens' KV
    cached.allocate_cached("y", list(range(8)) + [99], salt=0)                  # (0, 8): prefill y from position 8
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Generic, NamedTuple, TypeVar

from neuronpack.runtime.engine.kv_blocks import BlockPool
from neuronpack.runtime.engine.prefix_cache import PrefixIndex

K = TypeVar("K")


class RowCopy(NamedTuple):
    """Copy cache positions 0..length-1 of row ``src`` into row ``dst`` (every layer, K and V)."""

    src: int
    dst: int
    length: int


class RowSwap(NamedTuple):
    """Exchange two rows' contents: positions 0..length_a-1 of row ``a`` go to row ``b`` and positions
    0..length_b-1 of row ``b`` to row ``a`` (every layer, K and V)."""

    a: int
    b: int
    length_a: int
    length_b: int


class BlockCopy(NamedTuple):
    """Copy between a row and the block pool: block ``slots[i]`` of ``row`` (positions slots[i] * block_size ..)
    and pool block ``blocks[i]``, into the pool when ``to_pool``, else into the row."""

    row: int
    slots: tuple[int, ...]
    blocks: tuple[int, ...]
    to_pool: bool


class BlockExchange(NamedTuple):
    """A row's prefix goes to the pool while pool blocks come into the same row, each copy reading its source before
    either writes (the blocks saved into may be the ones being loaded): ``save`` (to the pool), then ``load``."""

    save: BlockCopy
    load: BlockCopy


Move = RowCopy | RowSwap | BlockCopy | BlockExchange


class RowAllocator(Generic[K]):
    """Rows 0..size-1 of one compiled batch and the owner (a sequence) of each; with ``block_size`` (prefix caching
    on) the prefixes free rows keep, and a pool of ``cache_blocks`` blocks that only keep prefixes."""

    def __init__(self, size: int, cache_blocks: int = 0, block_size: int | None = None,
                 window: int | None = None) -> None:
        if size < 1:
            raise ValueError(f"a KV cache needs at least one row, got {size}")
        if cache_blocks < 0:
            raise ValueError(f"cache_blocks must be >= 0, got {cache_blocks}")
        self.size = size
        self._owner: list[K | None] = [None] * size  # row -> owner
        self._index = PrefixIndex(block_size) if block_size is not None else None
        self.pool = (BlockPool(cache_blocks, block_size, self._index.clock)
                     if self._index is not None and block_size is not None and cache_blocks else None)
        self._pending: list[Move] = []  # copies allocations asked for, until the scheduler takes them
        self.window = window  # the model's sliding-window layers keep only this many positions (a ring): see _match

    @property
    def caching(self) -> bool:
        """Prefix caching is on."""
        return self._index is not None

    @property
    def cache_blocks(self) -> int:
        """Blocks of the pool beyond the batch (0: cached prefixes live in free rows only)."""
        return 0 if self.pool is None else self.pool.num_blocks

    @property
    def free(self) -> int:
        """Rows nobody holds."""
        return self._owner.count(None)

    def owners(self) -> list[K]:
        """Every owner, in row order."""
        return [o for o in self._owner if o is not None]

    def at(self, row: int) -> K:
        """The owner of ``row`` (KeyError when it is free)."""
        owner = self._owner[row]
        if owner is None:
            raise KeyError(f"cache row {row} is free")
        return owner

    def row(self, owner: K) -> int | None:
        """``owner``'s row, None when it holds none."""
        for row, held in enumerate(self._owner):
            if held is not None and held == owner:
                return row
        return None

    @property
    def cache_blocks_in_use(self) -> int:
        """Pool blocks that keep a prefix: what the prefix cache's memory budget pays for."""
        return 0 if self.pool is None else self.pool.used

    def cached_rows(self) -> dict[int, int]:
        """Free row -> positions of cached prefix it keeps."""
        return {} if self._index is None else {e.row: len(e.tokens) for e in self._index.entries()}

    def allocate(self, owner: K) -> int:
        """Give ``owner`` the least recently used free row (empty rows first, next to the held ones; ValueError when
        every row is held). A prefix the row kept is saved into the pool first (``take_copies``) or dropped."""
        return self._take(owner, self._least_recent_free(owner))

    def lookup(self, tokens: Sequence[int], salt: int = 0) -> int:
        """Positions of ``tokens`` whose KV a free row or the pool holds (under ``salt``), at most len - 1: at least
        one position is left to prefill, so the last token's logits exist. 0 without prefix caching."""
        return self._match(tokens, salt)[1]

    def allocate_cached(self, owner: K, tokens: Sequence[int], salt: int = 0) -> tuple[int, int]:
        """``allocate`` for a sequence whose row will hold ``tokens``: (its row, how many of its first positions
        hold their KV once ``take_copies``' copies are applied, ``lookup``'s count). It takes the free row holding the
        longest prefix of ``tokens`` (in place), topped up from the pool's blocks when they hold more."""
        (src, in_row), length = self._match(tokens, salt)
        index = self._index
        if index is None or length == 0:
            return self._take(owner, self._least_recent_free(owner)), 0
        if src is None or in_row == 0:  # only the pool holds it: the least recently used free row takes it
            src, in_row = self._least_recent_free(owner), 0
        else:  # in place: what the row kept beyond the shared prefix is saved (_vacate) at its own age
            entry = index.entry(src)
            if entry is not None and len(entry.tokens) <= in_row + 1:
                index.forget(src)  # nothing beyond what the new owner keeps: no copy
        if self.pool is not None:  # the row is to hold the prefix: the pool's copy of it goes first (demote)
            self.pool.demote(tokens[:length], salt)
        if length == in_row:
            self._take(owner, src, shared=in_row)
            return src, length
        # The pool holds more: its blocks after those the row holds (same tokens) come in. The row's old prefix may
        # be saved into those very blocks: one BlockExchange reads both sources before writing either.
        assert self.pool is not None
        ids = self.pool.match(tokens[: len(tokens) - 1], salt)
        first = in_row // self.pool.block_size
        load = BlockCopy(src, tuple(range(first, len(ids))), tuple(ids[first:]), False)
        save = self._claim(owner, src, shared=in_row)
        self._pending.append(load if save is None else BlockExchange(save, load))
        return src, length

    def release(self, owner: K, tokens: Sequence[int] = (), salt: int = 0) -> int | None:
        """Take ``owner``'s row back; returns it, or None. With prefix caching, ``tokens``: what the row's first
        positions hold KV of (kept for later prompts; () when its contents are garbage, e.g. a failed prefill)."""
        row = self.row(owner)
        if row is not None:
            self._owner[row] = None
            if self._index is not None and tokens:
                self._index.add(row, tokens, salt)
        return row

    def compact(self, length: Callable[[K], int], decoding: Collection[K] | None = None) -> list[Move]:
        """Put the ``decoding`` owners (default: every owner) into one window of adjacent rows, the one that copies
        the fewest positions (ties: the lowest). Returns the copies to apply to the caches, in order, after any copy
        an allocation asked for; ``length(owner)``: the positions of its row that hold data (what a move copies)."""
        held = [r for r, o in enumerate(self._owner) if o is not None and (decoding is None or o in decoding)]
        if held and held[-1] - held[0] + 1 != len(held):
            start = min(range(self.size - len(held) + 1), key=lambda w: (self._window_cost(w, held, length), w))
            window = range(start, start + len(held))
            outside = [r for r in held if r not in window]
            for src, dst in zip(outside, [r for r in window if r not in held], strict=True):
                self._move_into(src, dst, length)
        return self.take_copies()

    def take_copies(self) -> list[Move]:
        """The copies asked for since the last call (saving prefixes, reusing them, compaction), in order."""
        copies, self._pending = self._pending, []
        return copies

    def forget_cached(self) -> None:
        """Drop every cached prefix (the KV cache was written by someone else)."""
        if self._index is not None:
            for entry in list(self._index.entries()):
                self._index.forget(entry.row)
        if self.pool is not None:
            self.pool.clear()

    # -- internals -------------------------------------------------------------------------------------------------
    def _least_recent_free(self, owner: K) -> int:
        if self.row(owner) is not None:
            raise ValueError(f"{owner!r} already holds row {self.row(owner)}")
        free = [r for r, o in enumerate(self._owner) if o is None]
        if not free:
            raise ValueError(f"every one of the {self.size} cache rows is held")
        held = [r for r, o in enumerate(self._owner) if o is not None]

        def age(row: int) -> tuple[int, int, int]:
            entry = self._index.entry(row) if self._index is not None else None
            beside = not held or any(abs(row - h) == 1 for h in held)
            return (0 if entry is None else entry.last_used, 0 if beside else 1, row)

        return min(free, key=age)

    def _content(self, row: int, length: Callable[[K], int]) -> int:
        """Positions of ``row`` worth keeping: its owner's data, or the prefix a free row keeps."""
        owner = self._owner[row]
        if owner is not None:
            return length(owner)
        entry = self._index.entry(row) if self._index is not None else None
        return 0 if entry is None else len(entry.tokens)

    def _window_cost(self, start: int, held: list[int], length: Callable[[K], int]) -> int:
        window = range(start, start + len(held))
        return (sum(length(self._owner[r]) for r in held if r not in window)  # type: ignore[arg-type]
                + sum(self._content(r, length) for r in window if r not in held))

    def _move_into(self, src: int, dst: int, length: Callable[[K], int]) -> None:
        """Move ``src``'s owner into ``dst``; what ``dst`` holds (a prefix, a sequence) goes to ``src``."""
        moving, there = self._owner[src], self._owner[dst]
        entry = self._index.forget(dst) if self._index is not None else None
        kept = self._content(dst, length) if there is not None else (0 if entry is None else len(entry.tokens))
        size = length(moving)  # type: ignore[arg-type]
        self._owner[dst], self._owner[src] = moving, there
        if kept:
            self._pending.append(RowSwap(dst, src, kept, size))
            if entry is not None:
                moved = self._index.add(src, entry.tokens, entry.salt)  # type: ignore[union-attr]
                if moved is not None:
                    moved.last_used = entry.last_used
        elif size:
            self._pending.append(RowCopy(src, dst, size))

    def _take(self, owner: K, row: int, shared: int = 0) -> int:
        save = self._claim(owner, row, shared)
        if save is not None:
            self._pending.append(save)
        return row

    def _claim(self, owner: K, row: int, shared: int = 0) -> BlockCopy | None:
        """Give free ``row`` to ``owner``; returns the copy saving the prefix it kept into the pool (``_vacate``)."""
        if self._owner[row] is not None:
            raise ValueError(f"cache row {row} is held")
        save = self._vacate(row, shared)
        self._owner[row] = owner
        return save

    def _match(self, tokens: Sequence[int], salt: int) -> tuple[tuple[int | None, int], int]:
        """((the free row holding the longest prefix or None, its length), the longest prefix a row or the pool
        holds), over tokens[:-1]."""
        if self._index is None or len(tokens) < 2:
            return (None, 0), 0
        body = tokens[: len(tokens) - 1]
        found = self._index.longest_match(body, salt, usable=self._ring_keeps)
        in_row = (None, 0) if found is None else found
        in_pool = 0 if self.pool is None else len(self.pool.match(body, salt)) * self.pool.block_size
        return in_row, max(in_row[1], in_pool)

    def _ring_keeps(self, entry, matched: int) -> bool:
        """Whether a free row still holds the KV a prompt reusing ``matched`` positions of it needs. Rings of
        ``window`` positions (plus room for a verify step's rejected tokens) keep, of a row that held
        ``len(entry.tokens)`` positions, those from len - window on, so a prompt starting at ``matched`` finds the
        window below it only when it continues the row (matched >= len - 1) or the ring never wrapped."""
        held = len(entry.tokens)
        return self.window is None or matched >= held - 1 or held <= self.window

    def _vacate(self, row: int, shared: int = 0) -> BlockCopy | None:
        """``row`` (a free batch row) is about to be overwritten: the copy saving the full blocks of the prefix it
        keeps into the pool, those the pool does not hold yet, as far as blocks used longer ago than it make room.
        ``shared``: positions the new owner keeps in place; a prefix that is mostly those (the pool would hold copies
        of what the row keeps) takes only free blocks and demoted ones, never another prefix's."""
        if self._index is None or (entry := self._index.forget(row)) is None or self.pool is None:
            return None
        evict = len(entry.tokens) - shared >= shared
        writes = self.pool.save(entry.tokens, entry.salt, entry.last_used, evict=evict)
        if not writes:
            return None
        return BlockCopy(row, tuple(s for s, _ in writes), tuple(b for _, b in writes), True)
