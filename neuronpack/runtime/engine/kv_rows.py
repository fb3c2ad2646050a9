"""The one owner of KV-cache rows: which sequence holds which row of the compiled batch, for the target model and
its draft alike, and which rows hold cached prefixes (automatic prefix caching) (torch-free).

A compiled step over n sequences runs on cache rows 0..n-1 (the graphs read the views ``cache[:n]``: contiguous, no
copy), so the rows of the running sequences must be packed. ``RowAllocator`` hands a new sequence the lowest free
row, takes it back when the sequence ends, and, when an ended sequence leaves a hole below a running one,
``compact`` moves the highest running rows down into the holes and says which cache prefixes to copy
(``RowCopy``). The copies are data: the scheduler puts them into its ``StepPlan``, the runner applies them to the
target's KV cache and the EAGLE draft's, before the step's model calls. Parallel sampling (n > 1) shares a prompt's
prefill the same way: ``RowCopy(leader's row, fork's row, prompt length)`` after the leader's prefill.

Prefix caching (vLLM's automatic prefix caching, over rows instead of blocks): a released row keeps its KV and the
tokens it holds (``release(owner, tokens, salt)``; the salt is the LoRA adapter, which changes every position's KV).
``allocate_cached`` gives a new sequence the lowest free row and, when a free row or a cache row holds KV of a
prefix of its prompt (found by chained block hashes, prefix_cache.py), the copy of that prefix into its row (none
when it is the same row, nor when that row itself holds as long a match: it is reused in place): the sequence is
then prefilled from the first uncached position. Before a free row that holds a prefix is overwritten (a new owner,
a compaction move), its prefix is saved into one of ``cache_rows`` extra rows (indices size..size+cache_rows-1,
never run by a step) unless a cache row already covers it, evicting the least recently used cache row, or dropped
when it is the least recently used itself. Memory stays bounded by
size + cache_rows rows whatever is cached.

Nothing else tracks rows: the model's KV cache is addressed by row and only applies the copies it is given; the
EAGLE proposer keeps its draft KV in the same rows. Paged KV (rows become block tables) would be a change to this
allocator and the copies it emits alone; the scheduler, the runner and the model see rows and copies as they do now.

Example::

    rows = RowAllocator(4)
    a, b, c = "a", "b", "c"
    rows.allocate(a), rows.allocate(b), rows.allocate(c)     # (0, 1, 2)
    rows.release(a)                                          # row 0 is a hole below b and c
    rows.compact({b: 7, c: 12}.__getitem__)                  # [RowCopy(src=2, dst=0, length=12)]: c moves down
    rows.row(c), rows.owners()                               # (0, ['c', 'b'])

    cached = RowAllocator(2, cache_rows=2, block_size=4)
    cached.allocate("x"); cached.release("x", tokens=list(range(10)), salt=0)   # row 0 keeps 10 tokens' KV
    cached.allocate_cached("y", list(range(8)) + [99], salt=0)                  # (0, 8): prefill y from position 8
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

from neuronpack.runtime.engine.prefix_cache import PrefixIndex

K = TypeVar("K")


class RowCopy(NamedTuple):
    """Copy cache positions 0..length-1 of row ``src`` into row ``dst`` (every layer, K and V)."""

    src: int
    dst: int
    length: int


class RowAllocator(Generic[K]):
    """Rows 0..size-1 of one compiled batch and the owner (a sequence) of each; with ``block_size`` (prefix caching
    on) the prefixes free rows keep, and ``cache_rows`` more rows that only keep prefixes."""

    def __init__(self, size: int, cache_rows: int = 0, block_size: int | None = None) -> None:
        if size < 1:
            raise ValueError(f"a KV cache needs at least one row, got {size}")
        if cache_rows < 0:
            raise ValueError(f"cache_rows must be >= 0, got {cache_rows}")
        self.size = size
        self.cache_rows = cache_rows if block_size is not None else 0
        self._owner: list[K | None] = [None] * size  # row -> owner
        self._index = PrefixIndex(block_size) if block_size is not None else None
        self._pending: list[RowCopy] = []  # copies allocations asked for, until the scheduler takes them

    @property
    def caching(self) -> bool:
        """Prefix caching is on."""
        return self._index is not None

    @property
    def total_rows(self) -> int:
        """Rows the KV cache must have: the batch's, then the cache rows."""
        return self.size + self.cache_rows

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
    def cache_rows_in_use(self) -> int:
        """Cache rows (beyond the batch) that keep a prefix: what the prefix cache's memory budget pays for."""
        return 0 if self._index is None else sum(1 for e in self._index.entries() if e.row >= self.size)

    def cached_rows(self) -> dict[int, int]:
        """Row -> positions of cached prefix it keeps (free batch rows and cache rows)."""
        return {} if self._index is None else {e.row: len(e.tokens) for e in self._index.entries()}

    def allocate(self, owner: K) -> int:
        """Give ``owner`` the lowest free row (ValueError when every row is held). A prefix the row kept is saved
        into a cache row first (``take_copies``) or dropped."""
        return self._take(owner, self._lowest_free(owner))

    def lookup(self, tokens: Sequence[int], salt: int = 0) -> int:
        """Positions of ``tokens`` whose KV a free or cache row holds (under ``salt``), at most len - 1: at least one
        position is left to prefill, so the last token's logits exist. 0 without prefix caching."""
        match = self._match(tokens, salt)
        return 0 if match is None else match[1]

    def allocate_cached(self, owner: K, tokens: Sequence[int], salt: int = 0) -> tuple[int, int]:
        """``allocate`` for a sequence whose row will hold ``tokens``: (its row, how many of its first positions
        already hold their KV, ``lookup``'s count). The copy that puts them there (when another row held them) is
        among ``take_copies``."""
        match, index = self._match(tokens, salt), self._index
        row = self._lowest_free(owner)
        if match is None or index is None:
            return self._take(owner, row), 0
        src, length = match
        if src != row and (own := index.longest_match(tokens[: len(tokens) - 1], salt, (row,))) is not None \
                and own[1] >= length:
            # The row it takes holds as much of the prompt as the best match (prompts sharing a system prompt, each
            # free row holding it): reuse it in place rather than copy an equal prefix over it. One token less is
            # not enough: prefilling a token costs more than copying a row's prefix.
            src, length = own
        index.touch(src)
        if src == row:  # the prefix is in the row itself; what it holds beyond the match is saved (if worth it)
            entry = index.entry(row)
            if entry is not None and len(entry.tokens) <= length + 1:
                index.forget(row)  # nothing beyond what the new owner keeps: no copy
            self._take(owner, row)
            return row, length
        self._take(owner, row, protect=src)
        self._pending.append(RowCopy(src, row, length))
        return row, length

    def release(self, owner: K, tokens: Sequence[int] = (), salt: int = 0) -> int | None:
        """Take ``owner``'s row back; returns it, or None. With prefix caching, ``tokens``: what the row's first
        positions hold KV of (kept for later prompts; () when its contents are garbage, e.g. a failed prefill)."""
        row = self.row(owner)
        if row is not None:
            self._owner[row] = None
            if self._index is not None and tokens:
                self._index.add(row, tokens, salt)
        return row

    def compact(self, cached_length: Callable[[K], int]) -> list[RowCopy]:
        """Pack the held rows into rows 0..n-1: the owner of the highest held row moves into the lowest hole, until
        none is left. Returns the copies to apply to the caches, in order (each ``dst`` is a hole, never a later
        ``src``), after any copy an allocation asked for; ``cached_length(owner)``: the positions of its row that
        hold data (what a move must copy)."""
        held = len(self.owners())
        for hole in range(held):
            if self._owner[hole] is not None:
                continue
            src = max(r for r, o in enumerate(self._owner) if o is not None)
            owner = self._owner[src]
            self._vacate(hole)
            self._owner[hole], self._owner[src] = owner, None
            if (length := cached_length(owner)) > 0:
                self._pending.append(RowCopy(src, hole, length))
        return self.take_copies()

    def take_copies(self) -> list[RowCopy]:
        """The copies asked for since the last call (saving prefixes, reusing them, compaction), in order."""
        copies, self._pending = self._pending, []
        return copies

    def forget_cached(self) -> None:
        """Drop every cached prefix (the KV cache was written by someone else)."""
        if self._index is not None:
            self._index = PrefixIndex(self._index.block_size)

    # -- internals -------------------------------------------------------------------------------------------------
    def _lowest_free(self, owner: K) -> int:
        if self.row(owner) is not None:
            raise ValueError(f"{owner!r} already holds row {self.row(owner)}")
        try:
            return self._owner.index(None)
        except ValueError:
            raise ValueError(f"every one of the {self.size} cache rows is held") from None

    def _take(self, owner: K, row: int, protect: int | None = None) -> int:
        self._vacate(row, protect)
        self._owner[row] = owner
        return row

    def _match(self, tokens: Sequence[int], salt: int) -> tuple[int, int] | None:
        if self._index is None or len(tokens) < 2:
            return None
        return self._index.longest_match(tokens[: len(tokens) - 1], salt)

    def _vacate(self, row: int, protect: int | None = None) -> None:
        """``row`` (a free batch row) is about to be overwritten: save the prefix it keeps into a cache row, unless
        one covers it already or every cache row was used more recently (then it is dropped). Never evicts
        ``protect`` (the source of a copy this allocation asked for)."""
        if self._index is None or (entry := self._index.forget(row)) is None or not self.cache_rows:
            return
        cache = range(self.size, self.size + self.cache_rows)
        superset, subset = self._index.covering(entry.tokens, entry.salt, cache)
        if superset is not None:
            superset.last_used = max(superset.last_used, entry.last_used)
            return
        empty = [r for r in cache if r not in self._index and r != protect]
        if subset is not None and subset.row != protect:
            target = subset.row
        elif empty:
            target = empty[0]
        else:
            used = [e for e in self._index.entries() if e.row >= self.size and e.row != protect]
            if not used:
                return
            oldest = min(used, key=lambda e: e.last_used)
            if oldest.last_used > entry.last_used:
                return
            target = oldest.row
        self._pending.append(RowCopy(row, target, len(entry.tokens)))
        saved = self._index.add(target, entry.tokens, entry.salt)
        if saved is not None:
            saved.last_used = entry.last_used
