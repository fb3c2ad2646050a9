"""Bounds on the digits of the JSON numbers a grammar lets a model write.

llguidance compiles a JSON Schema ``number`` to ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?`` (its JSON
options bound whitespace, not digits: ``grammar.py`` uses them for that), so a model that likes the token "0" writes
``1.000000...`` until ``max_tokens``. No schema needs more digits than a float64 or an int64 printed by any JSON
library: JavaScript writes up to 21 integer digits (1e20 as ``100000000000000000000``) and up to ~23 fraction
digits (``0.0000012345678901234567``), Python 3-digit exponents (``1e-308``). So a number part may have at most
``MAX_DIGITS`` digits; past that the digit tokens are masked out, and the grammar's other tokens (a ``.``, an ``e``,
a ``,``, a ``}``) end the part. A mask this would leave empty (a schema that insists on more digits) is left to the
grammar alone.

The bound follows the text the request has generated with a small scanner (in a string, in a number part and how
many digits, elsewhere), token by token: ``NumberBound.advance`` after each token, ``forbidden`` for the tokens the
next step may not take (cached per scanner state: a few dozen states, each computed once over the tokens that hold a
digit).

Example::

    bound = NumberBound(token_bytes)           # one per tokenizer
    state = bound.advance(START, token)        # after each emitted token
    bound.clear(mask_words, state)             # before sampling: digit tokens past a bound refused
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

OUT, STRING, ESCAPE, INT, FRACTION, EXPONENT = range(6)
MAX_DIGITS = {INT: 24, FRACTION: 24, EXPONENT: 3}
Scan = tuple[int, int]  # (where the text is, digits so far in the current number part)
START: Scan = (OUT, 0)
_DIGITS = frozenset(b"0123456789")


def scan(state: Scan, data: bytes) -> tuple[Scan, bool]:
    """The scanner state after ``data``, and whether a number part went past its ``MAX_DIGITS`` on the way."""
    where, count = state
    exceeded = False
    for byte in data:
        if where == STRING:
            where = ESCAPE if byte == 0x5C else OUT if byte == 0x22 else STRING  # \\ or "
            continue
        if where == ESCAPE:
            where = STRING
            continue
        if where in MAX_DIGITS:
            if byte in _DIGITS:
                count += 1
                exceeded = exceeded or count > MAX_DIGITS[where]
                continue
            if byte == 0x2E and where == INT:  # .
                where, count = FRACTION, 0
                continue
            if byte in b"eE" and where in (INT, FRACTION):
                where, count = EXPONENT, 0
                continue
            if byte in b"+-" and where == EXPONENT and count == 0:
                continue
            where, count = OUT, 0  # the number ended: this byte is read outside it
        if byte == 0x22:
            where = STRING
        elif byte == 0x2D or byte in _DIGITS:  # - or a digit starts a number
            where, count = INT, int(byte in _DIGITS)
    return (where, count), exceeded


class NumberBound:
    """The digit bound for one tokenizer: ``token_bytes[t]`` is token t's text as bytes (b"" for special tokens)."""

    def __init__(self, token_bytes: Sequence[bytes]) -> None:
        import numpy as np

        self._bytes = token_bytes
        self._digit_tokens = [t for t, data in enumerate(token_bytes) if _DIGITS.intersection(data)]
        self._forbidden: dict[Scan, np.ndarray] = {}
        self._lock = threading.Lock()
        self._empty = np.zeros(0, dtype=np.int64)

    def advance(self, state: Scan, token: int) -> Scan:
        data = self._bytes[token] if 0 <= token < len(self._bytes) else b""
        return scan(state, data)[0]

    def forbidden(self, state: Scan) -> np.ndarray:
        """Token ids that would take a number part past its bound from ``state`` (int64, sorted)."""
        found = self._forbidden.get(state)
        if found is None:
            import numpy as np

            ids = [t for t in self._digit_tokens if scan(state, self._bytes[t])[1]]
            found = np.asarray(ids, dtype=np.int64) if ids else self._empty
            with self._lock:
                self._forbidden[state] = found
        return found

    def clear(self, words: np.ndarray, state: Scan) -> None:
        """Clear, in place, the bits of the forbidden tokens in one row of a token bitmask (``words``: int32 or
        uint32 [vocab / 32], bit b of word w is token 32w + b), unless that would leave no token allowed."""
        import numpy as np

        ids = self.forbidden(state)
        if ids.size == 0:
            return
        ids = ids[ids < words.size * 32]
        row = words.view(np.uint32)
        before = row.copy()
        np.bitwise_and.at(row, ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))
        if not row.any():
            row[:] = before


def token_bytes(tokenizer, vocab_size: int) -> list[bytes]:
    """Every token's bytes from llguidance's tokenizer (b"" for special tokens and ids past its vocabulary)."""
    out = []
    for token in range(vocab_size):
        try:
            out.append(b"" if tokenizer.is_special_token(token) else tokenizer.decode_bytes([token]))
        except (ValueError, IndexError, OverflowError):
            out.append(b"")
    return out
