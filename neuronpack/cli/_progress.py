"""How progress is shown on stderr: ``--progress auto|rich|plain|none``.

- rich: live bars (the default on a terminal);
- plain: log lines for CI logs, as ``docker build --progress=plain`` prints them: one line when a stage starts, one
  when it ends, and in between a progress line (percent or bytes, rate, elapsed) at most every PLAIN_INTERVAL seconds;
- none: no progress at all (info lines and warnings still print, unless --quiet);
- auto: rich when stderr is a terminal, plain otherwise.
"""

from __future__ import annotations

import os
import threading
import time
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

PLAIN_INTERVAL_ENV = "NEURONPACK_PROGRESS_INTERVAL"
PLAIN_INTERVAL = 10.0


class ProgressMode(str, Enum):
    auto = "auto"
    rich = "rich"
    plain = "plain"
    none = "none"


def resolve_mode(mode: ProgressMode, console: Console, *, quiet: bool) -> ProgressMode:
    if quiet:
        return ProgressMode.none
    if mode is ProgressMode.auto:
        return ProgressMode.rich if console.is_terminal else ProgressMode.plain
    return mode


def plain_interval() -> float:
    try:
        return float(os.environ.get(PLAIN_INTERVAL_ENV, PLAIN_INTERVAL))
    except ValueError:
        return PLAIN_INTERVAL


def human_bytes(n: float) -> str:
    """The one size format of every command (binary units: 1 KiB = 1024 B): ``human_bytes(4162972)`` -> ``'4.0 MiB'``
    (ls, gc, inspect, quantize, progress rates)."""
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{n:.0f} B"


class PlainTask:
    """One stage rendered as log lines; ``advance`` is thread-safe (parallel transfers call it)."""

    def __init__(self, console: Console, description: str, total: float | None, unit: str | None) -> None:
        self._console = console
        self._description = description
        self._total = total
        self._bytes = unit == "bytes"
        self._done = 0.0
        self._lock = threading.Lock()
        self._interval = plain_interval()
        self._start = self._last = time.monotonic()

    def __enter__(self) -> PlainTask:
        started = f"{self._description}: started"
        if self._total and self._total > 1:  # a task without a total (None) prints no size
            started += f" ({self._amount(self._total) if self._bytes else f'{self._total:g} steps'})"
        self._emit(started)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        status = "failed" if exc_type is not None else "done"
        self._emit(f"{self._description}: {status} in {time.monotonic() - self._start:.1f}s")

    def advance(self, amount: float = 1) -> None:
        with self._lock:
            self._done += amount
            now = time.monotonic()
            if now - self._last < self._interval:
                return
            self._last = now
            line = f"{self._description}: {self._progress(now)}"
        self._emit(line)

    def describe(self, description: str) -> None:
        with self._lock:
            self._description = description
        self._emit(f"{description}: started")

    def _progress(self, now: float) -> str:
        elapsed = now - self._start
        text = self._amount(self._done)
        if self._total:
            text = f"{text} / {self._amount(self._total)} ({100 * self._done / self._total:.0f}%)"
        if self._bytes and elapsed > 0:
            text += f", {human_bytes(self._done / elapsed)}/s"
        return f"{text}, {elapsed:.0f}s elapsed"

    def _amount(self, n: float) -> str:
        return human_bytes(n) if self._bytes else f"{n:g}"

    def _emit(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self._console.print(f"[{stamp}] {line}", markup=False, highlight=False, soft_wrap=True)
