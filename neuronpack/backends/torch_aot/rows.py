"""Which KV-cache row holds which slot, so a decode step over n active slots runs on rows 0..n-1 only (torch-free).

The token-generation graph takes the cache views ``cache[:n]`` (contiguous, no copy): the active slots must sit in
the first n rows. ``RowMap`` keeps the slot -> row table and, when the active set is not packed, plans the row
swaps that pack it (moving an active slot from a high row into a low row held by an idle slot). It also tracks how
many positions of each row were ever written, so a swap copies only that prefix, not the whole ``max_seq``.

Example::

    rows = RowMap(4)
    rows.wrote(rows.row(3), 12)          # slot 3's prompt filled positions 0..11 of its row
    rows.pack([3])                       # [(0, 3, 12)]: swap rows 0 and 3, first 12 positions; slot 3 is now row 0
    rows.row(3), rows.row(0)             # (0, 3)
"""

from __future__ import annotations

from collections.abc import Sequence


class RowMap:
    """Slot -> cache-row permutation plus each row's written length."""

    def __init__(self, size: int) -> None:
        self._row_of = list(range(size))  # slot -> row
        self._slot_of = list(range(size))  # row -> slot
        self._filled = [0] * size  # row -> positions written so far (an upper bound)

    def row(self, slot: int) -> int:
        return self._row_of[slot]

    def rows(self, slots: Sequence[int]) -> list[int]:
        return [self._row_of[s] for s in slots]

    def wrote(self, row: int, length: int) -> None:
        """Positions 0..length-1 of ``row`` now hold data."""
        if length > self._filled[row]:
            self._filled[row] = length

    def pack(self, slots: Sequence[int]) -> list[tuple[int, int, int]]:
        """Make ``slots`` occupy rows 0..len(slots)-1; return the swaps to apply to the cache, in order, as
        ``(row_a, row_b, length)``: exchange the first ``length`` positions of the two rows."""
        n = len(slots)
        active = set(slots)
        high = [s for s in slots if self._row_of[s] >= n]
        free_low = [r for r in range(n) if self._slot_of[r] not in active]
        swaps = []
        for slot, low in zip(high, free_low, strict=True):
            high_row = self._row_of[slot]
            length = max(self._filled[low], self._filled[high_row])
            if length:
                swaps.append((low, high_row, length))
            other = self._slot_of[low]
            self._row_of[slot], self._row_of[other] = low, high_row
            self._slot_of[low], self._slot_of[high_row] = slot, other
            self._filled[low], self._filled[high_row] = self._filled[high_row], self._filled[low]
        return swaps
