"""The prefix cache's memory beyond the batch, in blocks (torch-free): ``BlockPool`` keeps cached prefixes as chains
of ``block_size``-token blocks, the way vLLM's block pool does, so a 400-token prefix costs 400 tokens of KV (25
blocks of 16), not a whole KV row, and prefixes that share their first blocks (one system prompt, many questions)
share those blocks.

A block is named by its chained hash (prefix_cache.py ``block_hashes``: block i's hash covers every token up to it
and the LoRA salt) and keeps its own tokens, so a lookup compares tokens and a hash collision never reuses wrong KV.
A chain is always whole from block 0: eviction takes the least recently used *leaf* (a block no other cached block
continues), so what is left of a prefix is still a prefix. The pool only decides which block ids hold what; the
copies between a KV row and the pool's blocks are ``BlockCopy`` moves (kv_rows.py) the runner applies to the
model's ``KvCache`` (its block tensors, ``reserve_blocks``).

Example::

    pool = BlockPool(num_blocks=8, block_size=4)
    pool.save(list(range(10)), salt=0)          # [(0, 0), (1, 1)]: blocks 0..1 of the row go to pool blocks 0 and 1
    pool.match([*range(9), 42], salt=0)         # [0, 1]: the first 8 tokens' KV are in pool blocks 0, 1
    pool.save([*range(4), 9, 9, 9, 9], salt=0)  # [(1, 2)]: block 0 is shared, only the new block 1 is written
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from neuronpack.runtime.engine.prefix_cache import block_hashes


@dataclass(eq=False)
class Block:
    """One pool block: the KV of ``tokens`` (one block of a prefix) whose chained hash is ``hash``."""

    id: int
    hash: bytes
    parent: bytes | None  # the hash of the block before it in its chain (None: block 0)
    tokens: tuple[int, ...]
    children: int = 0  # cached blocks that continue this one
    last_used: int = 0


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` token positions holding cached prefixes, least recently used leaf
    first to go."""

    def __init__(self, num_blocks: int, block_size: int, clock: Iterator[int] | None = None) -> None:
        if num_blocks < 0 or block_size < 1:
            raise ValueError(f"a block pool needs num_blocks >= 0 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._by_hash: dict[bytes, Block] = {}
        self._free = list(range(num_blocks - 1, -1, -1))  # popped from the end: lowest id first
        self._clock = clock if clock is not None else itertools.count(1)  # ages (shared with the rows' index)

    @property
    def used(self) -> int:
        """Blocks holding KV (what the budget pays for)."""
        return len(self._by_hash)

    def prefixes(self) -> int:
        """Distinct prefixes held: chains that no cached block continues."""
        return sum(1 for b in self._by_hash.values() if b.children == 0)

    def match(self, tokens: Sequence[int], salt: int) -> list[int]:
        """The pool blocks holding the longest chain of ``tokens``' full blocks under ``salt`` (compared token by
        token), in order; [] when not even block 0 is cached."""
        ids: list[int] = []
        size = self.block_size
        for i, h in enumerate(block_hashes(tokens, salt, size)):
            block = self._by_hash.get(h)
            if block is None or block.tokens != tuple(tokens[i * size:(i + 1) * size]):
                break
            ids.append(block.id)
        return ids

    def demote(self, tokens: Sequence[int], salt: int) -> None:
        """A row holds the chain of ``tokens`` now (its owner's prompt): the pool's copy of it is first to go when
        room is needed, with the single line of blocks that continues it here (a previous request's question and
        answer, useless without the prefix the pool would no longer keep). Blocks other prefixes branch from (a
        system prompt many questions share) keep their age: they still serve those. The row's prefix is saved again
        before the row is overwritten."""
        line = [self._by_hash[h] for h in itertools.takewhile(self._by_hash.__contains__,
                                                               block_hashes(tokens, salt, self.block_size))]
        if not line:
            return
        while line[-1].children == 1:  # the single line continuing the chain
            line.append(next(b for b in self._by_hash.values() if b.parent == line[-1].hash))
        for block in reversed(line):
            if block.children > 1:
                return
            block.last_used = 0

    def save(self, tokens: Sequence[int], salt: int, last_used: int | None = None,
             evict: bool = True) -> list[tuple[int, int]]:
        """Keep ``tokens``' full blocks (a row about to be overwritten holds their KV): returns the (block index in
        the row, pool block id) pairs to copy, for the blocks the pool did not hold yet. Makes room by evicting least
        recently used leaves (with ``evict`` False only demoted ones: copies of what a row holds), never a block of
        this chain; when no room is left, the chain is kept as far as it fits. ``last_used``: the chain's age
        (default: now). A block it takes may be one a pending copy reads: the caller orders the copies so."""
        stamp = next(self._clock) if last_used is None else last_used
        size, chain, writes = self.block_size, set(), []
        parent: bytes | None = None
        for i, h in enumerate(block_hashes(tokens, salt, size)):
            block = self._by_hash.get(h)
            piece = tuple(tokens[i * size:(i + 1) * size])
            if block is not None and block.tokens != piece:
                break  # a colliding hash: keep the chain up to here
            if block is None:
                block_id = self._take(chain, stamp if evict else 0)
                if block_id is None:
                    break
                block = self._by_hash[h] = Block(block_id, h, parent, piece)
                if parent is not None:
                    self._by_hash[parent].children += 1
                writes.append((i, block_id))
            block.last_used = max(block.last_used, stamp)
            chain.add(block.id)
            parent = h
        return writes

    def clear(self) -> None:
        """Forget every block (the KV cache was written by someone else)."""
        self._by_hash.clear()
        self._free = list(range(self.num_blocks - 1, -1, -1))

    def _take(self, keep: set[int], stamp: int) -> int | None:
        """A free block id, evicting the least recently used leaf used no later than ``stamp`` outside ``keep`` (0:
        demoted ones only)."""
        if self._free:
            return self._free.pop()
        leaves = [b for b in self._by_hash.values() if b.children == 0 and b.id not in keep and b.last_used <= stamp]
        if not leaves:
            return None
        oldest = min(leaves, key=lambda b: b.last_used)
        del self._by_hash[oldest.hash]
        if oldest.parent is not None:
            self._by_hash[oldest.parent].children -= 1
        return oldest.id
