"""The KV cache of a loaded portable artifact: one K and one V tensor ``[layers, batch_size, kv_heads, seq_len + 1,
head_dim]``, read by the layer graphs through per-layer views of the first n rows and written here with the K/V the
graphs return (``store``).

It is addressed by row (and pool block) and keeps no bookkeeping of its own: which sequence holds which row is the
runtime's ``RowAllocator`` (runtime/engine/kv_rows.py), which keeps a step's rows packed into one window of adjacent
rows and hands the moves that do it (compaction, parallel sampling's shared prompt, the prefix pool's block copies)
to ``move``. A caller that runs rows that are not packed
(the backend's own tests, a bench) gets ``gathered`` copies of them instead of views: correct, only slower.

Example::

    cache = KvCache.for_config(config)                 # zeros, resident only where written
    cache.copy_rows([(3, 0, 12)])                       # row 3's first 12 positions into row 0
    cache.reserve_blocks(64, 16)                        # a pool of 64 blocks of 16 positions (prefix caching)
    cache.move([BlockCopy(row=0, slots=(0,), blocks=(5,), to_pool=True)])  # kv_rows.py: row 0's 0..15 -> block 5
    k_rows, v_rows = cache.views(1)                     # per-layer views cache[l, :1]
    cache.store(torch.arange(1), starts, new_k, new_v)  # the step's K/V at their positions
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from neuronpack.backends.torch_aot.artifact_config import ArtifactConfig


class KvCache:
    """The cache tensors and their row views; with ``reserve_blocks`` a pool of blocks beyond the rows
    (``[layers, blocks, kv_heads, block_size, head_dim]``, K and V) that keeps cached prefixes, reached by
    ``move`` only."""

    def __init__(self, shape: tuple[int, int, int, int, int], dtype) -> None:
        self.k = untouched_zeros(shape, dtype)
        self.v = untouched_zeros(shape, dtype)
        self.block_k: torch.Tensor | None = None
        self.block_v: torch.Tensor | None = None
        # Per-layer views of the first n rows (contiguous), built once per n on first use.
        self._views: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    @classmethod
    def for_config(cls, config: ArtifactConfig) -> KvCache:
        import torch

        shape = (config.num_layers, config.batch_size, config.num_kv_heads, config.kv_cache_positions,
                 config.head_dim)
        return cls(shape, getattr(torch, config.torch_dtype))

    def views(self, n_rows: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V views of rows 0..n_rows-1 (what a step over n rows reads)."""
        views = self._views.get(n_rows)
        if views is None:
            views = self._views[n_rows] = ([k[:n_rows] for k in self.k], [v[:n_rows] for v in self.v])
        return views

    def span(self, first: int, n_rows: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V views of rows first..first+n_rows-1 (contiguous like ``views``; a prefill into the
        rows above the running ones reads its cached prefix through them)."""
        if first == 0:
            return self.views(n_rows)
        end = first + n_rows
        return [k[first:end] for k in self.k], [v[first:end] for v in self.v]

    @property
    def rows(self) -> int:
        return self.k.shape[1]

    @property
    def row_bytes(self) -> int:
        """Bytes of one row, every layer, K and V."""
        return 2 * self.k[:, 0].numel() * self.k.element_size()

    @property
    def token_bytes(self) -> int:
        """Bytes of one position of a row, every layer, K and V."""
        return 2 * self.k[:, 0, :, 0].numel() * self.k.element_size()

    @property
    def blocks(self) -> int:
        """Blocks of the prefix pool (0: none reserved)."""
        return 0 if self.block_k is None else self.block_k.shape[2]

    def reserve_blocks(self, blocks: int, block_size: int) -> None:
        """A pool of at least ``blocks`` blocks of ``block_size`` positions (zeros, resident only where written):
        never fewer than it has (another engine on this model may address them); another block size replaces it.
        Laid out ``[layers, kv_heads, blocks, block_size, head_dim]``, like a row's positions: a run of blocks is
        one strided copy."""
        layers, _, kv, _, hd = self.k.shape
        if self.block_k is not None and self.block_k.shape[3] == block_size:
            blocks = max(blocks, self.block_k.shape[2])
        shape = (layers, kv, blocks, block_size, hd)
        if self.block_k is None or tuple(self.block_k.shape) != shape:
            self.block_k = untouched_zeros(shape, self.k.dtype)
            self.block_v = untouched_zeros(shape, self.k.dtype)

    def gathered(self, rows: Sequence[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V copies of ``rows``, in that order (a step over rows that are not packed)."""
        index = list(rows)
        return [k[index] for k in self.k], [v[index] for v in self.v]

    def store(self, rows, starts, new_k, new_v) -> None:
        """Write a step's K/V ([layers, n, kv, T, hd]) into ``rows`` at positions ``starts[i]..``."""
        from neuronpack.models.attention import store_kv

        store_kv(self.k, rows, starts, new_k)
        store_kv(self.v, rows, starts, new_v)

    def copy_rows(self, copies: Sequence[tuple[int, int, int]]) -> None:
        """Apply ``(src, dst, length)`` copies in order: positions 0..length-1 of row src into row dst."""
        import torch

        with torch.inference_mode():
            for src, dst, length in copies:
                for cache in (self.k, self.v):
                    cache[:, dst, :, :length] = cache[:, src, :, :length]

    def move(self, moves: Sequence) -> None:
        """Apply the runtime's row moves in order (runtime/engine/kv_rows.py, read by their fields): a copy
        ``(src, dst, length)``, a swap (``a``, ``b``, ``length_a``, ``length_b``: two rows exchange their first
        positions), a block copy (``row``, ``slots``, ``blocks``, ``to_pool``: blocks of a row to or from the
        pool) and an exchange (``save``, ``load``: two block copies of one row, both sources read first)."""
        import torch

        with torch.inference_mode():
            for move in moves:
                if hasattr(move, "load"):  # an exchange: the row's blocks are read before the pool's come in
                    end = (max(move.save.slots) + 1) * self.block_k.shape[3]
                    held = [cache[:, move.save.row, :, :end].clone() for cache in (self.k, self.v)]
                    self._copy_blocks(move.load)
                    self._copy_blocks(move.save, held)
                elif hasattr(move, "to_pool"):
                    self._copy_blocks(move)
                elif hasattr(move, "length_a"):
                    for cache in (self.k, self.v):
                        saved = cache[:, move.a, :, :move.length_a].clone()
                        cache[:, move.a, :, :move.length_b] = cache[:, move.b, :, :move.length_b]
                        cache[:, move.b, :, :move.length_a] = saved
                else:
                    self.copy_rows([move])

    def _copy_blocks(self, move, held: Sequence[torch.Tensor] | None = None) -> None:
        """One block copy; ``held``: the row's K and V as they were (an exchange's save), read instead of the row."""
        if self.block_k is None or self.block_v is None:
            raise ValueError("a block copy needs a block pool (reserve_blocks)")
        layers, kv, _, size, hd = self.block_k.shape
        rows = (self.k[:, move.row], self.v[:, move.row]) if held is None else held
        for slot, block, n in _runs(move.slots, move.blocks):  # consecutive slots in consecutive blocks: one copy
            for cache, pool in zip(rows, (self.block_k, self.block_v), strict=True):
                row = cache[:, :, slot * size:(slot + n) * size].view(layers, kv, n, size, hd)
                blocks = pool[:, :, block:block + n]
                if move.to_pool:
                    blocks.copy_(row)
                else:
                    row.copy_(blocks)


def _runs(slots: Sequence[int], blocks: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first slot, first block, length) of each run where slots and blocks both go up by one."""
    runs: list[tuple[int, int, int]] = []
    for slot, block in zip(slots, blocks, strict=True):
        if runs and runs[-1][0] + runs[-1][2] == slot and runs[-1][1] + runs[-1][2] == block:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((slot, block, 1))
    return runs


def untouched_zeros(shape: tuple[int, ...], dtype):
    """A zero tensor backed by a private anonymous mapping: pages become resident only when written, so a KV cache
    costs the memory of the positions sequences really reach, not of every slot at full length (torch.zeros writes
    every page). Never written positions are never read unmasked either way."""
    import math
    import mmap

    import torch

    nbytes = max(1, math.prod(shape) * torch.empty((), dtype=dtype).element_size())
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)
