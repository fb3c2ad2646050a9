"""Consoles, output formats, the one result printer, the rich progress reporter and the error boundary shared by
every command.

Text that comes from the domain (error lines, warnings, file names, table cells) is printed with rich markup escaped:
"remove [speculation]" must not lose its brackets.

rich is imported when something is printed or a progress bar shown, not at start-up: a ``--quiet --format json`` run
(CI, scripts) never needs it, and importing it is ~20 ms of every command's start-up. Lines printed with
``LazyConsole.line`` (info lines, warnings, errors) do not import it either where rich would print their characters
unchanged (not a terminal: a pipe, a log file, CI)."""

from __future__ import annotations

import builtins
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

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

    def line(self, text: str, *, prefix: str = "", style: str = "") -> None:
        """Print ``text`` verbatim (no markup, no highlighting, never wrapped) as one line, after ``prefix`` and a
        space when given (``style``: the prefix's rich style on a terminal).

        Where rich would write the characters unchanged, they are written without importing rich: the console is
        not a terminal (see ``_verbatim_file``) and the line holds nothing rich transforms (``_VERBATIM``).

        Example: ``stderr.line("the draft has no lm_head", prefix="warning:", style="yellow")``."""
        plain = f"{prefix} {text}" if prefix else text
        file = self._verbatim_file()
        if file is not None and plain.isprintable() and "\\" not in plain and not _REPLACED.search(plain):
            file.write(plain + "\n")
            file.flush()  # as rich does after every print
        elif prefix:
            self.print(f"[{style}]{escape(prefix)}[/] {escape(text)}", highlight=False, soft_wrap=True)
        else:
            self.print(text, markup=False, highlight=False, soft_wrap=True)

    def _verbatim_file(self) -> TextIO | None:
        """The stream this console writes to when rich would write plain text to it as is: no console made yet with
        options that change that, not a terminal (rich's own test: FORCE_COLOR or TTY_COMPATIBLE set, Jupyter and
        IDLE are left to rich); else None."""
        if self._console is not None or not set(self._options) <= {"stderr", "highlight", "soft_wrap"}:
            return None
        if "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ or hasattr(builtins, "get_ipython"):
            return None
        if getattr(sys.stdin, "__module__", "").startswith("idlelib"):
            return None
        file = sys.stderr if self._options.get("stderr") else sys.stdout
        try:
            return None if file.isatty() else file
        except (AttributeError, ValueError):  # no isatty, or a closed stream: rich decides
            return None


# What rich changes in text it prints even when it does not style it: emoji codes (":smile:"), and escaped markup
# around a backslash; non-printable characters (tabs, control codes) are checked apart (str.isprintable).
_REPLACED = re.compile(r":\S*:")


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
            stderr.line(exc.one_line(), prefix="error:", style="bold red")
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
        stdout.line(text)  # into a pipe or file (a script's $(...)) without importing rich
    elif text is not None:
        print_table(stdout, text)


def print_table(console: LazyConsole | Console, table: RenderableType) -> None:
    """Print a table (or any renderable) so no key or figure in it is cut. Into a pipe or a log (not a terminal,
    ``COLUMNS`` unset) it prints at its natural width, where rich would cut it at 80 columns; on a terminal it fits the
    window, and the tables keep their keys and figures whole by making those columns ``no_wrap`` (the label columns
    wrap instead)."""
    real = console.get() if isinstance(console, LazyConsole) else console
    if not real.is_terminal:
        from rich.console import Console

        columns = os.environ.get("COLUMNS", "")  # read now: rich reads it once, when the console is made
        width = int(columns) if columns.isdigit() else \
            max(real.width, real.measure(table, options=real.options.update_width(1 << 16)).maximum)
        if width != real.width:  # print's own width= cannot exceed the console's
            real = Console(file=real.file, width=width, highlight=False, color_system=None)
    real.print(table)



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
            stderr.line(message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        stderr.line(message, prefix="warning:", style="yellow")
