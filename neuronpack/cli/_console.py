"""Consoles, output formats, the one result printer, the rich progress reporter and the error boundary shared by
every command.

Text that comes from the domain (error lines, warnings, file names, table cells) is printed with rich markup escaped:
"remove [speculation]" must not lose its brackets.

rich is imported when something is printed or a progress bar shown, not at start-up: a ``--quiet --format json`` run
(CI, scripts) never needs it, and importing it is ~20 ms of every command's start-up."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from neuronpack.cli._progress import PlainTask, ProgressMode, resolve_mode
from neuronpack.errors import NeuronpackError

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.progress import Progress

F = TypeVar("F", bound=Callable[..., Any])


class LazyConsole:
    """A rich ``Console`` made on first use (see the module docstring); attributes are the console's.

    Example::

        stderr = LazyConsole(stderr=True)
        stderr.print("hello")       # imports rich and makes the Console now
    """

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def get(self) -> Console:
        """The console itself (for rich objects that take one)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)


stderr = LazyConsole(stderr=True, highlight=False)
stdout = LazyConsole(highlight=False, soft_wrap=True)


def escape(text: str) -> str:
    """``text`` with rich markup escaped (``rich.markup.escape``)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


class OutputFormat(str, Enum):
    text = "text"
    json = "json"


def debug_enabled() -> bool:
    return os.environ.get("NEURONPACK_DEBUG", "") not in ("", "0", "false")


def handle_errors(fn: F) -> F:
    """Turn a NeuronpackError into one line on stderr and exit code 1 (traceback only with NEURONPACK_DEBUG=1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NeuronpackError as exc:
            if debug_enabled():
                raise
            stderr.print(f"[bold red]error:[/] {escape(exc.one_line())}", markup=True, highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            stderr.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def print_json(obj: Any) -> None:
    """One JSON object on stdout (machine-readable result)."""
    sys.stdout.write(json.dumps(obj, indent=None, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def print_result(output_format: OutputFormat, data: Any, text: str | RenderableType | None = None) -> None:
    """The one way a command prints its result on stdout: ``data`` as one JSON object with ``--format json``, else
    ``text`` (a plain line, printed verbatim, or a rich renderable such as a Table; nothing when None)."""
    if output_format is OutputFormat.json:
        print_json(data)
    elif isinstance(text, str):
        stdout.print(text, markup=False, highlight=False, soft_wrap=True)
    elif text is not None:
        stdout.print(text)


def cell(value: Any) -> str:
    """A table cell from domain text: rich markup in it is shown, not interpreted."""
    return escape(str(value))


class _RichTask:
    def __init__(self, progress: Progress | None, task_id: int | None) -> None:
        self._progress = progress
        self._id = task_id

    def advance(self, amount: float = 1) -> None:
        if self._progress is not None and self._id is not None:
            self._progress.advance(self._id, amount)

    def describe(self, description: str) -> None:
        if self._progress is not None and self._id is not None:
            self._progress.update(self._id, description=description)


class RichReporter:
    """Renders domain progress on stderr as rich bars, plain log lines or nothing (``--progress``, see
    _progress.py); info lines unless quiet, warnings always."""

    def __init__(self, *, quiet: bool = False, progress: ProgressMode = ProgressMode.auto) -> None:
        self.quiet = quiet
        self.mode = resolve_mode(progress, stderr, quiet=quiet)
        self.show_bars = self.mode is ProgressMode.rich
        self.warnings: list[str] = []

    @contextmanager
    def task(self, description: str, total: float | None = None, *, unit: str | None = None) -> Iterator[Any]:
        if self.mode is ProgressMode.plain:
            with PlainTask(stderr, description, total, unit) as task:
                yield task
            return
        if not self.show_bars:
            yield _RichTask(None, None)
            return
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )

        counts = [DownloadColumn(), TransferSpeedColumn()] if unit == "bytes" else [MofNCompleteColumn()]
        columns = [TextColumn("{task.description}"), BarColumn(), *counts, TimeElapsedColumn()]
        with Progress(*columns, console=stderr.get(), transient=False) as progress:
            task_id = progress.add_task(description, total=total)
            yield _RichTask(progress, task_id)
            if total is not None:
                progress.update(task_id, completed=total)

    def info(self, message: str) -> None:
        if not self.quiet:
            stderr.print(message, markup=False, highlight=False, soft_wrap=True)

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        stderr.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)
