"""The one owner of KV-cache rows: which sequence holds which row of the compiled batch, for the target model and
its draft alike (torch-free).

A compiled step over n sequences runs on cache rows 0..n-1 (the graphs read the views ``cache[:n]``: contiguous, no
copy), so the rows of the running sequences must be packed. ``RowAllocator`` hands a new sequence the lowest free
row, takes it back when the sequence ends, and, when an ended sequence leaves a hole below a running one,
``compact`` moves the highest running rows down into the holes and says which cache prefixes to copy
(``RowCopy``). The copies are data: the scheduler puts them into its ``StepPlan``, the runner applies them to the
target's KV cache and the EAGLE draft's, before the step's model calls. Parallel sampling (n > 1) shares a prompt's
prefill the same way: ``RowCopy(leader's row, fork's row, prompt length)`` after the leader's prefill.

Nothing else tracks rows: the model's KV cache is addressed by row and only applies the copies it is given; the
EAGLE proposer keeps its draft KV in the same rows. So prefix caching (a row, or later a block, shared by the
sequences whose prompts start alike, copied or referenced instead of prefilled) or paged KV (rows become block
tables) is a change to this allocator and the copies it emits alone; the scheduler, the runner and the model see
rows and copies as they do now.

Example::

    rows = RowAllocator(4)
    a, b, c = "a", "b", "c"
    rows.allocate(a), rows.allocate(b), rows.allocate(c)     # (0, 1, 2)
    rows.release(a)                                          # row 0 is a hole below b and c
    rows.compact({b: 7, c: 12}.__getitem__)                  # [RowCopy(src=2, dst=0, length=12)]: c moves down
    rows.row(c), rows.owners()                               # (0, ['c', 'b'])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

K = TypeVar("K")


class RowCopy(NamedTuple):
    """Copy cache positions 0..length-1 of row ``src`` into row ``dst`` (every layer, K and V)."""

    src: int
    dst: int
    length: int


class RowAllocator(Generic[K]):
    """Rows 0..size-1 of one compiled batch and the owner (a sequence) of each."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a KV cache needs at least one row, got {size}")
        self.size = size
        self._owner: list[K | None] = [None] * size  # row -> owner

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

    def allocate(self, owner: K) -> int:
        """Give ``owner`` the lowest free row (ValueError when every row is held)."""
        if self.row(owner) is not None:
            raise ValueError(f"{owner!r} already holds row {self.row(owner)}")
        try:
            row = self._owner.index(None)
        except ValueError:
            raise ValueError(f"every one of the {self.size} cache rows is held") from None
        self._owner[row] = owner
        return row

    def release(self, owner: K) -> int | None:
        """Take ``owner``'s row back (its contents become garbage, never read unmasked); returns it, or None."""
        row = self.row(owner)
        if row is not None:
            self._owner[row] = None
        return row

    def compact(self, cached_length: Callable[[K], int]) -> list[RowCopy]:
        """Pack the held rows into rows 0..n-1: the owner of the highest held row moves into the lowest hole, until
        none is left. Returns the copies to apply to the caches, in order (each ``dst`` is a hole, never a later
        ``src``); ``cached_length(owner)``: the positions of its row that hold data (what a move must copy)."""
        copies: list[RowCopy] = []
        held = len(self.owners())
        for hole in range(held):
            if self._owner[hole] is not None:
                continue
            src = max(r for r, o in enumerate(self._owner) if o is not None)
            owner = self._owner[src]
            self._owner[hole], self._owner[src] = owner, None
            if (length := cached_length(owner)) > 0:
                copies.append(RowCopy(src, hole, length))
        return copies
