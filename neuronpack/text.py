"""Text that goes into a recipe or a manifest (names, labels, model sources, ``--set`` values) and comes back in one
line of output: control characters are refused, not stored.

A newline in such a value truncates or splits it silently (TOML reads ``--set 'name="a"<newline>b=1'`` as two keys,
a log line breaks in two); a carriage return or an escape sequence rewrites the terminal that prints it. Refused:
Unicode category Cc (C0, DEL, C1: newline, tab, NUL, ESC, ...) and the line / paragraph separators (Zl, Zp).

Example::

    control_character("ok-name")      # None
    control_character("a\\nb")        # (1, '\\n')
    control_character_problem("a\\nb")  # "holds a control character '\\n' at position 1"
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from typing import Any

REFUSED_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})


def control_character(text: str) -> tuple[int, str] | None:
    """(position, character) of the first control character in ``text``, or None."""
    for position, char in enumerate(text):
        if unicodedata.category(char) in REFUSED_CATEGORIES:
            return position, char
    return None


def control_character_problem(text: str) -> str | None:
    """What is wrong with ``text`` as one sentence fragment, or None when it holds no control character."""
    found = control_character(text)
    if found is None:
        return None
    position, char = found
    return f"holds a control character {char!r} at position {position}"


def strings_with_paths(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every string inside nested dicts and lists (keys included), with its key path, e.g. (("lora", "adapters", "0",
    "name"), "sql")."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, child in value.items():
            yield path + (str(key),), str(key)
            yield from strings_with_paths(child, path + (str(key),))
    elif isinstance(value, list | tuple):
        for index, child in enumerate(value):
            yield from strings_with_paths(child, path + (str(index),))
