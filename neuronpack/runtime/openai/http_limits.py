"""The HTTP side of the server's limits: a request body cap checked while the body arrives, and a uvicorn server
whose shutdown (SIGTERM / SIGINT) lets in-flight requests finish for a grace period, then ends them cleanly.

The queue bound and the per-request deadline live in the engine (``EngineLimits``): they are about slots, not HTTP.

Example::

    app = create_app(engine, served_model_name="m", limits=ServerLimits(max_body_bytes=1 << 20))
    serve_gracefully(app, engine, host="127.0.0.1", port=8000, shutdown_grace=25)
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn

from neuronpack.runtime.limits import DEFAULT_MAX_BODY_BYTES

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass(frozen=True)
class ServerLimits:
    """HTTP limits: the largest request body in bytes (None: unlimited)."""

    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES


class BodySizeLimit:
    """ASGI middleware: 413 (OpenAI error shape, connection closed) for a body over ``max_bytes``, decided from
    Content-Length before reading anything, or as soon as a chunked body goes past the limit. The body (at most
    ``max_bytes``) is buffered and replayed to the app, so nothing downstream ever sees more.

    ``on_reject`` is called once per refused request (a metrics counter)."""

    def __init__(self, app, max_bytes: int, on_reject: Callable[[], None] = lambda: None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._reject(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left while sending its body: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body only http.disconnect is left

        await self.app(scope, replay, send)

    async def _reject(self, send: Send) -> None:
        self.on_reject()
        payload = {"error": {
            "message": f"the request body is larger than this server's limit of {self.max_bytes} bytes "
                       "(neuronpack serve --max-body-bytes)",
            "type": "invalid_request_error", "param": None, "code": "request_too_large"}}
        data = json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": data})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class GracefulServer(uvicorn.Server):
    """uvicorn's server, plus: on shutdown, the engine refuses new requests and, after ``grace`` seconds, ends
    every request still in flight (uvicorn itself stops accepting and waits for open connections)."""

    def __init__(self, config: uvicorn.Config, engine, grace: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.grace = grace

    async def shutdown(self, sockets=None) -> None:
        self.engine.drain()
        timer = asyncio.get_running_loop().call_later(self.grace, self.engine.abort_all)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def serve_gracefully(app, engine, *, host: str, port: int, shutdown_grace: float, log_level: str = "info") -> None:
    """Run ``app`` with uvicorn until SIGTERM or SIGINT, then shut down gracefully (blocking).

    On the signal: stop accepting connections and new requests (503), let in-flight requests run for
    ``shutdown_grace`` seconds, then end those still running (streams get an error event and ``[DONE]``,
    others a 503) and return. SIGTERM then returns normally (exit status 0); SIGINT keeps its KeyboardInterrupt.
    """
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=log_level == "debug",
                            lifespan="on", timeout_graceful_shutdown=shutdown_grace + 10)
    server = GracefulServer(config, engine, shutdown_grace)
    # uvicorn re-raises the signal it caught once it has shut down; a no-op SIGTERM handler makes that re-raise
    # harmless, so a graceful SIGTERM ends with exit status 0 instead of death by signal.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
