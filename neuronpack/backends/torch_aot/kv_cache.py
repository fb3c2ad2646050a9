"""The KV cache of a loaded portable artifact and the packing of its rows: one K and one V tensor
``[layers, batch_size, kv_heads, seq_len + 1, head_dim]``, read by the layer graphs through per-layer views of the
first n rows and written here with the K/V the graphs return (``store``).

Slots ``0..batch_size-1`` are logical: ``RowMap`` (rows.py) keeps the active ones packed into the first cache rows,
so a step over n slots runs at batch n (``pack`` swaps the written prefixes of the rows it moves).

Example::

    cache = KvCache.for_config(config)                 # zeros, resident only where written
    cache.pack([3])                                     # [0]: slot 3 now in row 0
    k_rows, v_rows = cache.views(1)                     # per-layer views cache[l, :1]
    cache.store(torch.arange(1), starts, new_k, new_v)  # the step's K/V at their positions
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from neuronpack.backends.torch_aot.rows import RowMap

if TYPE_CHECKING:
    import torch

    from neuronpack.backends.torch_aot.artifact_config import ArtifactConfig


class KvCache:
    """The cache tensors, their row views, and which row holds which slot."""

    def __init__(self, shape: tuple[int, int, int, int, int], dtype) -> None:
        layers, batch = shape[0], shape[1]
        self.k = untouched_zeros(shape, dtype)
        self.v = untouched_zeros(shape, dtype)
        # Per-layer views of the first n rows for every n (contiguous), built once.
        self._views = [([self.k[i, :n] for i in range(layers)], [self.v[i, :n] for i in range(layers)])
                       for n in range(batch + 1)]
        self.rows = RowMap(batch)

    @classmethod
    def for_config(cls, config: ArtifactConfig) -> KvCache:
        import torch

        shape = (config.num_layers, config.batch_size, config.num_kv_heads, config.kv_cache_positions,
                 config.head_dim)
        return cls(shape, getattr(torch, config.torch_dtype))

    def views(self, n_rows: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V views of rows 0..n_rows-1 (what a step over n rows reads)."""
        return self._views[n_rows]

    def store(self, rows, starts, new_k, new_v) -> None:
        """Write a step's K/V ([layers, n, kv, T, hd]) into ``rows`` at positions ``starts[i]..``."""
        from neuronpack.models.llama import store_kv

        store_kv(self.k, rows, starts, new_k)
        store_kv(self.v, rows, starts, new_v)

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src``'s row into slot ``dst``'s."""
        import torch

        a, b = self.rows.row(src), self.rows.row(dst)
        with torch.inference_mode():
            for cache in (self.k, self.v):
                cache[:, b, :, :length] = cache[:, a, :, :length]
        self.rows.wrote(b, length)

    def pack(self, slots: Sequence[int]) -> list[int]:
        """Move ``slots`` into rows 0..len(slots)-1 (in some order), swapping the written prefixes; return each
        slot's row."""
        import torch

        for a, b, length in self.rows.pack(slots):
            with torch.inference_mode():
                for cache in (self.k, self.v):
                    rows = cache[:, [a, b], :, :length]  # a copy of both rows' prefixes
                    cache[:, a, :, :length] = rows[:, 1]
                    cache[:, b, :, :length] = rows[:, 0]
        return self.rows.rows(slots)


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
