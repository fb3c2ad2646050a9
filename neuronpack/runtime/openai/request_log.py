"""``neuronpack serve --request-log FILE``: one JSON line per request the engine finished, in the format ``neuronpack
buckets plan --traffic`` reads (``neuronpack/traffic.py``, docs/buckets.md), written by a thread of its own.

A line per engine request (each of the ``n`` choices of a request is one), however it ended: ``prompt_tokens``,
``completion_tokens``, ``cached_tokens`` (the prefix cache's hits; a parallel sample past the first copies the whole
prompt), ``batch`` (the mean number of sequences of its decode steps, rounded; absent when it had none),
``arrived_at`` (submitted to the engine, after tokenizing: vLLM's arrival time), ``first_token_at``,
``finished_at`` (Unix seconds, to the millisecond); with ``prompts`` also ``prompt``, the prompt as the model saw it
(chat template applied, special tokens left out). Never the prompt's text otherwise.

The engine thread only counts: each output of a request goes through its ``RequestTrace`` (the first token's time,
the decode steps' batch sizes), and the request's end puts one tuple on a queue. A ``logging.handlers.QueueListener``
thread makes the line (``TrafficRecord.to_json_line``, the prompt decoded when asked) and writes it through the
standard library's ``RotatingFileHandler``: FILE grows to ``max_bytes``, then is renamed FILE.1 (FILE.1 to FILE.2,
...) and a new FILE begun; ``backups`` rotated files are kept, the oldest deleted. A line is never split across
files; a line that cannot be written (a full disk) is dropped, and the first one dropped is warned about.

Example::

    log = RequestLog(Path("requests.jsonl"), max_bytes=64 * 2**20, backups=3)
    log.start()
    trace = log.trace(request)   # then trace.observe(out) for each of the request's StepOutputs, on the engine thread
    log.close()                  # writes every line queued, closes the file
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import queue
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from neuronpack.errors import ServeError
from neuronpack.traffic import TrafficRecord

if TYPE_CHECKING:
    from neuronpack.runtime.engine import GenerationRequest, StepOutput

# One finished request, as the engine thread queues it: (prompt_tokens, completion_tokens, cached_tokens, batch or
# None, arrived_at, first_token_at or None, finished_at, the prompt's ids or None)
_Finished = tuple


class RequestTrace:
    """One engine request's line in the making. ``observe`` runs on the engine thread for each of the request's
    outputs and only counts; at the request's end it queues the line's values."""

    __slots__ = ("_put", "_prompt_ids", "_arrived", "_first", "_rows", "_steps")

    def __init__(self, put: Callable[[_Finished], None], prompt_ids: Sequence[int] | None) -> None:
        self._put = put
        self._prompt_ids = prompt_ids
        self._arrived = time.time()
        self._first: float | None = None
        self._rows = self._steps = 0

    def observe(self, out: StepOutput) -> None:
        if out.token_ids and self._first is None:
            self._first = time.time()
        if out.batch is not None:
            self._rows += out.batch
            self._steps += 1
        if out.finish_reason is not None:
            batch = round(self._rows / self._steps) if self._steps else None
            self._put((out.prompt_tokens, out.completion_tokens, out.num_cached_tokens, batch, self._arrived,
                       self._first, time.time(), self._prompt_ids))


class RequestLog:
    """The request log of one server: ``trace(request)`` for each request the engine gets, ``start()`` before the
    first, ``close()`` after the last (it writes what is queued). ``decode``: given, each line also carries the
    prompt's text, decoded by it on the log's thread. ``warn``: says once that lines are being dropped.
    ServeError (what, where, fix) when ``path`` cannot be written."""

    def __init__(self, path: Path, *, max_bytes: int, backups: int,
                 decode: Callable[[Sequence[int]], str] | None = None, warn: Callable[[str], None] | None = None
                 ) -> None:
        check_request_log(path)
        if max_bytes < 1 or backups < 1:  # RotatingFileHandler never rotates when either is 0: the file would grow
            raise ServeError(f"the request log needs a size cap and a rotated file to keep, got {max_bytes} bytes "
                             f"and {backups}", where=str(path), fix="give both at least 1")
        try:
            handler = _Handler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        except OSError as exc:
            raise ServeError(f"cannot open the request log: {exc.strerror or exc}", where=str(path),
                             fix="pass a file in a writable directory to --request-log") from None
        handler.warn = warn
        handler.setFormatter(_Line(decode))
        self.path = Path(path)
        self._with_prompts = decode is not None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._handler = handler
        self._listener = _Listener(self._queue, handler)
        self._running = False

    def start(self) -> None:
        """Start the thread that writes the lines."""
        if not self._running:
            self._listener.start()
            self._running = True

    def close(self) -> None:
        """Write every line queued, stop the thread and close the file."""
        if self._running:
            self._listener.stop()
            self._running = False
        self._handler.close()

    def trace(self, request: GenerationRequest) -> RequestTrace:
        """The trace of one engine request, arrived now."""
        return RequestTrace(self._queue.put, request.prompt_ids if self._with_prompts else None)


def check_request_log(path: Path) -> None:
    """ServeError (what, where, fix) unless ``path`` can be a request log: not a directory, in an existing
    directory this process may write to."""
    path = Path(path)
    fix = "pass a file in an existing, writable directory to --request-log"
    if path.is_dir():
        raise ServeError("the request log is a directory", where=str(path), fix=fix)
    parent = path.parent
    if not parent.is_dir():
        raise ServeError("the request log's directory does not exist", where=str(parent), fix=fix)
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ServeError("the request log is not writable", where=str(path), fix=fix)


# --- private ---------------------------------------------------------------------------------------------------------
class _Listener(logging.handlers.QueueListener):
    def prepare(self, record: _Finished) -> logging.LogRecord:  # type: ignore[override]
        # on the log's thread: the engine thread queued a plain tuple
        return logging.makeLogRecord({"msg": record})


class _Line(logging.Formatter):
    def __init__(self, decode: Callable[[Sequence[int]], str] | None) -> None:
        super().__init__()
        self._decode = decode

    def format(self, record: logging.LogRecord) -> str:
        line = getattr(record, "line", None)  # the handler formats a record twice (its size, then its write)
        if line is None:
            prompt, completion, cached, batch, arrived, first, finished, ids = record.msg
            text = self._decode(ids) if self._decode is not None and ids is not None else None
            line = TrafficRecord(prompt, completion, cached, batch, round(arrived, 3),
                                 None if first is None else round(first, 3), round(finished, 3), text).to_json_line()
            record.line = line
        return line


class _Handler(logging.handlers.RotatingFileHandler):
    warn: Callable[[str], None] | None = None
    dropped = 0

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        self.dropped += 1
        if self.dropped == 1 and self.warn is not None:
            self.warn(f"cannot write to the request log {self.baseFilename}: the lines that fail are dropped")
