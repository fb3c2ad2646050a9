"""Progress reporting without a UI dependency.

Domain code receives a ``Reporter`` and calls ``reporter.task(...)``; the CLI passes one that renders rich progress
bars on stderr, tests and library users get ``NullReporter``.

Example::

    with reporter.task("quantize tensors", total=len(names)) as task:
        for name in names:
            ...
            task.advance()
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol


class TaskHandle(Protocol):
    def advance(self, amount: float = 1) -> None: ...

    def describe(self, description: str) -> None: ...


class Reporter(Protocol):
    def task(self, description: str, total: float | None = None, *,
             unit: str | None = None) -> AbstractContextManager[TaskHandle]:
        """A stage of work; ``total`` in steps, or in bytes when ``unit="bytes"`` (advance() may be called from
        several threads at once)."""

    def info(self, message: str) -> None: ...

    def warn(self, message: str) -> None: ...


class _NullTask:
    def advance(self, amount: float = 1) -> None:
        pass

    def describe(self, description: str) -> None:
        pass

    def __enter__(self) -> _NullTask:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class NullReporter:
    """Reports nothing; warnings are kept so callers and tests can read them."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.messages: list[str] = []

    def task(self, description: str, total: float | None = None, *, unit: str | None = None) -> _NullTask:
        return _NullTask()

    def info(self, message: str) -> None:
        self.messages.append(message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)
