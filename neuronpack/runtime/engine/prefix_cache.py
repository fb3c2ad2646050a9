"""Automatic prefix caching, the index half (torch-free): which cache rows hold the KV of which tokens, found by a
prompt's tokens the way vLLM finds cached blocks, and which one to evict (least recently used).

A row that holds KV for tokens ``t[0..L-1]`` (a finished sequence's prompt and output, computed under one LoRA
adapter) is an ``Entry``. Its tokens are cut into blocks of ``block_size`` and each full block gets a hash chained
over the blocks before it and salted with what else changes KV (the adapter): block i's hash names the whole prefix
``t[0..(i+1)*block_size-1]`` under that adapter, so a prompt finds the rows sharing its longest full-block prefix
with one dict lookup per block, then the match is extended token by token inside the entry (the entry keeps its
tokens, so a hash collision can never reuse wrong KV: every reused token is compared).

This module decides nothing about rows being free or held: ``RowAllocator`` (kv_rows.py) owns the rows and asks
this index where a prefix is, registers what a released row holds, and forgets a row before it is overwritten.

Example::

    index = PrefixIndex(block_size=4)
    index.add(row=5, tokens=[1, 2, 3, 4, 5, 6, 7, 8, 9], salt=0)
    index.longest_match([1, 2, 3, 4, 5, 6, 7, 0], salt=0)     # (5, 7): row 5 holds the first 7 tokens' KV
    index.longest_match([1, 2, 3, 4, 5, 6, 7, 0], salt=1)     # None: another adapter's KV is not this one's
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from neuronpack.runtime.limits import DEFAULT_PREFIX_CACHE_MIB

DEFAULT_BLOCK_SIZE = 16  # vLLM's default block size: a prompt must share one full block to reuse anything
USEFUL_BLOCKS = 4  # a pool of fewer blocks (64 tokens at vLLM's size) keeps no prefix worth a lookup: said at start


@dataclass(frozen=True)
class PrefixCaching:
    """The prefix cache's settings: ``enabled`` (vLLM's ``--enable-prefix-caching``, on by default) and
    ``memory_mib``: the memory of the block pool added beyond the compiled batch to keep prefixes in, in blocks of
    ``block_size`` token positions (a prefix costs its length, rounded down to whole blocks; the rows of the batch
    that no sequence holds keep theirs too, at no extra cost); 0 keeps prefixes in free batch rows only. The bound is
    a hard one: the pool is allocated once, whatever it holds."""

    enabled: bool = True
    memory_mib: float = DEFAULT_PREFIX_CACHE_MIB
    block_size: int = DEFAULT_BLOCK_SIZE

    def blocks_for(self, model, proposer=None) -> tuple[str | None, int]:
        """(why prefix caching is off for ``model`` and its speculation ``proposer``, or None; the pool blocks the
        budget buys beyond the batch: 0 for a model whose KV cache has no pool, ``reserve_blocks``, and for one whose
        sliding-window layers keep only their window, ``kv_window``: a pool block would need positions their rings
        no longer hold, so those models reuse prefixes their free rows still hold whole, kv_rows.py)."""
        if not self.enabled:
            return "turned off (--no-enable-prefix-caching)", 0
        if proposer is not None and proposer.needs_hidden_states:
            return ("an EAGLE draft builds its KV of a prompt from the target's hidden states of that prompt, which "
                    "a cached prefix does not compute"), 0
        if not hasattr(model, "reserve_blocks") or getattr(model, "kv_window", None):
            return None, 0  # a model whose sliding-window layers keep only their window: prefixes in rows only
        return None, self.cache_blocks(getattr(model, "kv_token_bytes", 0))

    def block_bytes(self, token_bytes: int) -> int:
        """Bytes of one block: ``block_size`` positions of every layer's K and V (``token_bytes`` each)."""
        return self.block_size * token_bytes

    def cache_blocks(self, token_bytes: int) -> int:
        """Blocks the memory budget holds, for a model whose one KV position (every layer, K and V) is
        ``token_bytes``."""
        if not self.enabled or token_bytes <= 0:
            return 0
        return int(self.memory_mib * 2**20 // self.block_bytes(token_bytes))


def block_hashes(tokens: Sequence[int], salt: int, block_size: int) -> list[bytes]:
    """The chained hash of every full block of ``tokens``: hash i covers tokens 0..(i+1)*block_size-1 and ``salt``."""
    hashes: list[bytes] = []
    parent = salt.to_bytes(8, "little", signed=True)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start:start + block_size]
        parent = hashlib.blake2b(parent + b"".join(int(t).to_bytes(4, "little") for t in block),
                                 digest_size=16).digest()
        hashes.append(parent)
    return hashes


@dataclass(eq=False)
class Entry:
    """One row's cached KV: positions 0..len(tokens)-1 hold the KV of ``tokens`` under ``salt``."""

    row: int
    tokens: tuple[int, ...]
    salt: int
    hashes: list[bytes]
    last_used: int = field(default=0)


class PrefixIndex:
    """Rows holding cached KV, by block hash; least recently used first to go."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self._entries: dict[int, Entry] = {}  # row -> entry
        self._by_hash: dict[bytes, set[int]] = {}  # block hash -> rows whose entry has that block
        self.clock = itertools.count(1)  # ages, shared with the block pool (kv_blocks.py): one LRU order

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, row: int) -> bool:
        return row in self._entries

    def entry(self, row: int) -> Entry | None:
        return self._entries.get(row)

    def entries(self) -> Iterable[Entry]:
        return self._entries.values()

    def add(self, row: int, tokens: Sequence[int], salt: int) -> Entry | None:
        """Record that ``row`` holds the KV of ``tokens`` (replacing what it held). Fewer tokens than one block are
        not worth an entry: the row is forgotten instead (None)."""
        self.forget(row)
        if len(tokens) < self.block_size:
            return None
        entry = Entry(row, tuple(tokens), salt, block_hashes(tokens, salt, self.block_size), next(self.clock))
        self._entries[row] = entry
        for h in entry.hashes:
            self._by_hash.setdefault(h, set()).add(row)
        return entry

    def forget(self, row: int) -> Entry | None:
        """Drop ``row``'s entry (its KV is about to be overwritten); returns it."""
        entry = self._entries.pop(row, None)
        if entry is not None:
            for h in entry.hashes:
                rows = self._by_hash.get(h)
                if rows is not None:
                    rows.discard(row)
                    if not rows:
                        del self._by_hash[h]
        return entry

    def longest_match(self, tokens: Sequence[int], salt: int, rows: Iterable[int] | None = None,
                      usable: Callable[[Entry, int], bool] | None = None) -> tuple[int, int] | None:
        """(row, n): the row whose KV covers the longest prefix of ``tokens`` under ``salt`` and that prefix's
        length n (at least one full block), among ``rows`` (default: every entry) and the entries ``usable(entry,
        n)`` accepts (default: all); None when no row shares a full block. Ties go to the most recently used row."""
        allowed = None if rows is None else set(rows)
        candidates: set[int] = set()
        for h in block_hashes(tokens, salt, self.block_size):
            found = self._by_hash.get(h, set())
            if allowed is not None:
                found = found & allowed
            if not found:
                break
            candidates = found
        best: tuple[int, int, int] | None = None  # (matched, last_used, row)
        for row in candidates:
            entry = self._entries[row]
            matched = _common_prefix(entry.tokens, tokens)
            if matched < self.block_size or (usable is not None and not usable(entry, matched)):
                continue  # a colliding hash (the tokens decide), or KV the row no longer holds
            key = (matched, entry.last_used, row)
            if best is None or key > best:
                best = key
        return None if best is None else (best[2], best[0])

    def covering(self, tokens: Sequence[int], salt: int, rows: Iterable[int]) -> tuple[Entry | None, Entry | None]:
        """Among ``rows``' entries: one whose tokens start with all of ``tokens`` (keeping ``tokens`` would add
        nothing), and one whose tokens ``tokens`` start with (``tokens`` would replace it)."""
        superset = subset = None
        for row in rows:
            entry = self._entries.get(row)
            if entry is None or entry.salt != salt:
                continue
            common = _common_prefix(entry.tokens, tokens)
            if common == len(tokens):
                superset = entry
            elif common == len(entry.tokens):
                subset = entry
        return superset, subset


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
