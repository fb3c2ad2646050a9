"""The KV cache of a loaded portable artifact: one K and one V tensor ``[layers, batch_size, kv_heads, seq_len + 1,
head_dim]``, read by the layer graphs through per-layer views of the first n rows and written here with the K/V the
graphs return (``store``).

It is addressed by row and keeps no bookkeeping of its own: which sequence holds which row is the runtime's
``RowAllocator`` (runtime/engine/kv_rows.py), which keeps a step's rows packed into rows 0..n-1 and hands the copies
that does (compaction, parallel sampling's shared prompt) to ``copy_rows``. A caller that runs rows that are not packed
(the backend's own tests, a bench) gets ``gathered`` copies of them instead of views: correct, only slower.

Example::

    cache = KvCache.for_config(config)                 # zeros, resident only where written
    cache.copy_rows([(3, 0, 12)])                       # row 3's first 12 positions into row 0
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
    """The cache tensors and their row views."""

    def __init__(self, shape: tuple[int, int, int, int, int], dtype) -> None:
        self.k = untouched_zeros(shape, dtype)
        self.v = untouched_zeros(shape, dtype)
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

    def with_rows(self, rows: int) -> KvCache:
        """A zeroed cache like this one with ``rows`` rows (the runtime's batch rows plus its prefix-cache rows)."""
        shape = tuple(self.k.shape)
        return KvCache((shape[0], rows, *shape[2:]), self.k.dtype)

    def gathered(self, rows: Sequence[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V copies of ``rows``, in that order (a step over rows that are not packed)."""
        index = list(rows)
        return [k[index] for k in self.k], [v[index] for v in self.v]

    def store(self, rows, starts, new_k, new_v) -> None:
        """Write a step's K/V ([layers, n, kv, T, hd]) into ``rows`` at positions ``starts[i]..``."""
        from neuronpack.models.llama import store_kv

        store_kv(self.k, rows, starts, new_k)
        store_kv(self.v, rows, starts, new_v)

    def copy_rows(self, copies: Sequence[tuple[int, int, int]]) -> None:
        """Apply ``(src, dst, length)`` copies in order: positions 0..length-1 of row src into row dst."""
        import torch

        with torch.inference_mode():
            for src, dst, length in copies:
                for cache in (self.k, self.v):
                    cache[:, dst, :, :length] = cache[:, src, :, :length]


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
