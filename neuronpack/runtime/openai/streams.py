"""Bridges between the engine thread and asyncio handlers.

The engine calls a sink on its own thread; ``RequestGroup`` turns that into an async iterator of
``(choice index, StepOutput)`` for one HTTP request (one or several prompts), and aborts every unfinished request
of the group when the iteration stops early (client disconnected, handler cancelled). With a request log, each
request's outputs also go through its ``RequestTrace`` on the engine thread (counts only; request_log.py writes).

Example::

    group = RequestGroup(engine, [GenerationRequest(prompt_ids=(1, 2, 3), max_tokens=8)])
    async for index, out in group:
        print(index, out.text, out.finish_reason)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from neuronpack.runtime.engine import StepOutput

if TYPE_CHECKING:
    from starlette.requests import Request

    from neuronpack.runtime.engine import Engine, GenerationRequest
    from neuronpack.runtime.openai.request_log import RequestLog


class RequestGroup:
    """Submit several requests at once and read their outputs as they come, in arrival order.

    With ``n`` > 1, each run of ``n`` consecutive requests shares one prompt and is submitted as forks (one prefill
    per run, in chunks of at most the batch size). The yielded index is the request's position (OpenAI's choice
    index: prompt-major)."""

    def __init__(self, engine: Engine, requests: Sequence[GenerationRequest], n: int = 1,
                 log: RequestLog | None = None) -> None:
        self._engine = engine
        self._requests = list(requests)
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, StepOutput]] = asyncio.Queue()
        for request in self._requests:  # refuse the whole group before anything is queued
            engine.check(request)
        self._traces = [log.trace(r) for r in self._requests] if log is not None else None
        self._open = {r.request_id for r in self._requests}
        chunk = max(1, min(n, engine.model.batch_size))
        try:
            for start in range(0, len(self._requests), n):
                for first in range(start, start + n, chunk):
                    indices = range(first, min(first + chunk, start + n))
                    engine.submit_forks([self._requests[i] for i in indices], [self._sink_for(i) for i in indices])
        except BaseException:  # e.g. the queue filled up half-way through a batch: take back what went in
            self.abort()
            raise

    @property
    def engine(self) -> Engine:
        return self._engine

    def _sink_for(self, index: int):
        trace = self._traces[index] if self._traces is not None else None

        def sink(out: StepOutput) -> None:
            # Runs on the engine thread. A closed loop raises RuntimeError, which makes the engine drop the request.
            if trace is not None:
                trace.observe(out)  # counts (the log's own thread writes the line), before the loop may be gone
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (index, out))

        return sink

    async def __aiter__(self) -> AsyncIterator[tuple[int, StepOutput]]:
        try:
            while self._open:
                index, out = await self._queue.get()
                if out.finish_reason is not None:
                    self._open.discard(out.request_id)
                yield index, out
        finally:
            self.abort()

    def abort(self) -> None:
        """Abort every request of the group that has not finished (safe to call twice)."""
        for request_id in list(self._open):
            self._engine.abort(request_id)
        self._open.clear()


async def wait_for_disconnect(request: Request) -> None:
    """Return when the HTTP client goes away (the body has been read already, so only the disconnect is left)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_unless_disconnected(request: Request, coro) -> tuple[bool, object]:
    """Run ``coro`` but cancel it when the client disconnects first. Returns (completed, result)."""
    work = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        watcher.cancel()
        return True, work.result()
    work.cancel()
    try:
        await work
    except (asyncio.CancelledError, Exception):
        pass
    return False, None
