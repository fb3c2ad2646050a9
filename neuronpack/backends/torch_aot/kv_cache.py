"""The KV cache of a loaded portable artifact: one K and one V tensor ``[layers, batch_size, kv_heads, seq_len + 1,
head_dim]``, read by the layer graphs through per-layer views of the first n rows and written here with the K/V the
graphs return (``store``).

Sliding-window layers may keep only their window (``ring``: the artifact's ``kv_ring``): their K and V are
``[ring layers, batch_size, kv_heads, ring + 1, head_dim]``, position p at slot p % ring (the last slot is a spare,
see layout.cache_positions), so their memory stays ``ring`` positions per row whatever the sequence length. A step
stores only its valid tokens there (``lengths``: a right-padded prompt's padding would overwrite positions still in
the window), the last ``ring`` of them; the ring has room for a speculative step's rejected tokens beyond the window.

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

    ringed = KvCache((2, 4, 1, 129, 16), torch.float32, ring_layers=[0], ring=11)  # layer 0: 12 slots per row
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
    ``move`` only. ``shape``: the whole model's ``[layers, rows, kv, positions, hd]``; with ``ring``, the layers
    ``ring_layers`` keep a ring of ``ring`` positions instead (``ring_k`` / ``ring_v``)."""

    def __init__(self, shape: tuple[int, int, int, int, int], dtype, ring_layers: Sequence[int] = (),
                 ring: int | None = None) -> None:
        from neuronpack.backends.torch_aot.layout import cache_positions

        layers, rows, kv, positions, hd = shape
        self.ring = ring if ring_layers else None
        ringed = set(ring_layers) if self.ring else set()
        self._full = [i for i in range(layers) if i not in ringed]
        self._ringed = sorted(ringed)
        self.k = untouched_zeros((len(self._full), rows, kv, positions, hd), dtype)
        self.v = untouched_zeros((len(self._full), rows, kv, positions, hd), dtype)
        ring_shape = (len(self._ringed), rows, kv, cache_positions(self.ring or 0), hd)
        self.ring_k = untouched_zeros(ring_shape, dtype) if self.ring else None
        self.ring_v = untouched_zeros(ring_shape, dtype) if self.ring else None
        self.block_k: torch.Tensor | None = None
        self.block_v: torch.Tensor | None = None
        # Per-layer views of the first n rows (contiguous), built once per n on first use.
        self._views: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    @classmethod
    def for_config(cls, config: ArtifactConfig, ring_layers: Sequence[int] = ()) -> KvCache:
        """The cache an artifact runs with; ``ring_layers``: its sliding-window layers (ringed when the artifact
        has a ``kv_ring``)."""
        import torch

        shape = (config.num_layers, config.batch_size, config.num_kv_heads, config.kv_cache_positions,
                 config.head_dim)
        return cls(shape, getattr(torch, config.torch_dtype), ring_layers, config.kv_ring)

    def views(self, n_rows: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V views of rows 0..n_rows-1 (what a step over n rows reads)."""
        views = self._views.get(n_rows)
        if views is None:
            views = self._views[n_rows] = self._per_layer(lambda cache: cache[:n_rows])
        return views

    def span(self, first: int, n_rows: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V views of rows first..first+n_rows-1 (contiguous like ``views``; a prefill into the
        rows above the running ones reads its cached prefix through them)."""
        if first == 0:
            return self.views(n_rows)
        return self._per_layer(lambda cache: cache[first:first + n_rows])

    def _per_layer(self, rows) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each layer's K and V (in layer order) as ``rows(layer's cache [B, kv, positions, hd])``."""
        k: list = [None] * (len(self._full) + len(self._ringed))
        v: list = [None] * len(k)
        for stacks, layers in (((self.k, self.v), self._full), ((self.ring_k, self.ring_v), self._ringed)):
            for j, layer in enumerate(layers):
                k[layer], v[layer] = rows(stacks[0][j]), rows(stacks[1][j])
        return k, v

    @property
    def rows(self) -> int:
        return self.k.shape[1]

    @property
    def row_bytes(self) -> int:
        """Bytes of one row, every layer, K and V (a ringed layer's ring)."""
        ring = 0 if self.ring_k is None else self.ring_k[:, 0].numel()
        return 2 * (self.k[:, 0].numel() + ring) * self.k.element_size()

    @property
    def token_bytes(self) -> int:
        """Bytes of one position of a row, every layer that keeps every position, K and V."""
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
        return self._per_layer(lambda cache: cache[index])

    def store(self, rows, starts, new_k, new_v, lengths: Sequence[int] | None = None) -> None:
        """Write a step's K/V ([layers, n, kv, T, hd]) into ``rows`` at positions ``starts[i]..``; ``lengths``:
        each row's valid tokens (None: all T), the rest padding (a ringed layer never stores it)."""
        from neuronpack.models.attention import store_kv

        if not self._ringed:
            store_kv(self.k, rows, starts, new_k)
            store_kv(self.v, rows, starts, new_v)
            return
        full, ringed = _layer_index(self._full), _layer_index(self._ringed)
        if self._full:
            store_kv(self.k, rows, starts, new_k[full])
            store_kv(self.v, rows, starts, new_v[full])
        store_ring(self.ring_k, rows, starts, new_k[ringed], self.ring, lengths)
        store_ring(self.ring_v, rows, starts, new_v[ringed], self.ring, lengths)

    def copy_rows(self, copies: Sequence[tuple[int, int, int]]) -> None:
        """Apply ``(src, dst, length)`` copies in order: positions 0..length-1 of row src into row dst."""
        import torch

        with torch.inference_mode():
            for src, dst, length in copies:
                for cache, n in self._row_spans(length):
                    cache[:, dst, :, :n] = cache[:, src, :, :n]

    def _row_spans(self, length: int) -> list[tuple[torch.Tensor, int]]:
        """Each cache tensor with how many of its first positions hold a row's positions 0..length-1 (a ring: all
        its slots once it has wrapped)."""
        spans = [(self.k, length), (self.v, length)]
        if self.ring_k is not None:
            spans += [(self.ring_k, min(length, self.ring)), (self.ring_v, min(length, self.ring))]
        return spans

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
                    for (cache, n_a), (_, n_b) in zip(self._row_spans(move.length_a), self._row_spans(move.length_b),
                                                      strict=True):
                        saved = cache[:, move.a, :, :n_a].clone()
                        cache[:, move.a, :, :n_b] = cache[:, move.b, :, :n_b]
                        cache[:, move.b, :, :n_a] = saved
                else:
                    self.copy_rows([move])

    def _copy_blocks(self, move, held: Sequence[torch.Tensor] | None = None) -> None:
        """One block copy; ``held``: the row's K and V as they were (an exchange's save), read instead of the row."""
        if self.block_k is None or self.block_v is None:
            raise ValueError("a block copy needs a block pool (reserve_blocks)")
        if self.ring_k is not None:  # the engine keeps no pool for them (runtime/engine/prefix_cache.py)
            raise ValueError("ringed sliding-window layers keep no prefix blocks")
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


def store_ring(cache, rows, starts, new, ring: int, lengths: Sequence[int] | None) -> None:
    """Write ``new`` [ring layers, n, kv, T, hd] into the rings ``cache`` [ring layers, B, kv, ring + 1, hd]: row i's
    first ``lengths[i]`` tokens (all T when None), the last ``ring`` of them, position p at slot p % ring."""
    import torch

    t = new.shape[3]
    rows, starts = torch.as_tensor(rows).view(-1), torch.as_tensor(starts).view(-1)
    if t == 1 and lengths is None:  # a decode step: one slot per row
        cache[:, rows, :, starts % ring] = new[:, :, :, 0].transpose(0, 1)  # indexed dims first: [n, layers, kv, hd]
        return
    for i in range(len(rows)):
        end = t if lengths is None else int(lengths[i])
        first = max(0, end - ring)
        slots = (int(starts[i]) + torch.arange(first, end)) % ring
        cache[:, int(rows[i])].index_copy_(2, slots, new[:, i, :, first:end])


def _layer_index(layers: list[int]):
    import torch

    return torch.tensor(layers, dtype=torch.long)


def untouched_zeros(shape: tuple[int, ...], dtype):
    """A zero tensor backed by a private anonymous mapping: pages become resident only when written, so a KV cache
    costs the memory of the positions sequences really reach, not of every slot at full length (torch.zeros writes
    every page). Never written positions are never read unmasked either way."""
    import math
    import mmap

    import torch

    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:  # no layer of this kind (a model whose every layer is a ringed sliding window)
        return torch.zeros(shape, dtype=dtype)
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)
