"""HTTP errors in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` and the API-key check.

400 for invalid requests (``InvalidRequestError``, bad JSON and field validation included, so the openai client
raises BadRequestError), 401 for a wrong or missing API key, 404 for an unknown model or route, 405 for a wrong
method, 503 (with Retry-After) when the waiting queue is full or the server is shutting down, 504 past the request
deadline, 500 for a server fault (the model fails; any other ``ServeError``; anything unexpected: never a plain-text
500). /health and /metrics never need the API key (like vLLM).

Example::

    install_error_handlers(app)
    install_auth(app, api_key="secret")
    raise HTTPError(404, "no such model", "invalid_request_error", param="model")
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from neuronpack.errors import InvalidRequestError, ServeError, ServerBusyError
from neuronpack.runtime.engine.requests import StepOutput
from neuronpack.runtime.engine.stopping import FinishReason
from neuronpack.runtime.limits import RETRY_AFTER_SECONDS
from neuronpack.runtime.openai import schema as oa


class HTTPError(Exception):
    def __init__(self, status: int, message: str, type_: oa.ErrorType, *, param=None, code=None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


class _ErrorResponse(JSONResponse):
    """An OpenAI-shaped error, rendered ASCII-only: whatever text it quotes (even a lone surrogate), it encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode()


def raise_if_failed(out: StepOutput) -> None:
    """The HTTP error of a request that ended badly (error 500, timeout 504, shutdown 503); nothing otherwise."""
    if out.finish_reason is FinishReason.ERROR:
        raise HTTPError(500, f"generation failed: {out.error}", "server_error")
    if out.finish_reason is FinishReason.TIMEOUT:
        raise HTTPError(504, f"{out.error} (neuronpack serve --request-timeout); {out.completion_tokens} tokens "
                        "were generated", "server_error", code="request_timeout")
    if out.finish_reason is FinishReason.ABORT:
        raise HTTPError(503, "the server is shutting down", "server_error", code="shutting_down")


def install_error_handlers(app: FastAPI) -> None:
    def reply(status: int, message: str, type_: oa.ErrorType, param=None, code=None, headers=None) -> JSONResponse:
        return _ErrorResponse(oa.error_body(message, type_, param=param, code=code), status_code=status,
                              headers=headers)

    @app.exception_handler(HTTPError)
    async def http_error(_req: Request, exc: HTTPError) -> JSONResponse:
        return reply(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(InvalidRequestError)
    async def invalid(_req: Request, exc: InvalidRequestError) -> JSONResponse:
        return reply(400, exc.one_line(), "invalid_request_error", exc.param, 400)

    @app.exception_handler(ServeError)
    async def server_fault(_req: Request, exc: ServeError) -> JSONResponse:
        # not an InvalidRequestError (that handler is more specific): the server's fault, not the request's
        return reply(500, exc.one_line(), "server_error", None, 500)

    @app.exception_handler(ServerBusyError)
    async def busy(_req: Request, exc: ServerBusyError) -> JSONResponse:
        return reply(503, exc.one_line(), "server_error", None, "server_busy",
                     headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    @app.exception_handler(RequestValidationError)
    async def validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        param, message = _validation_message(exc.errors())
        return reply(400, message, "invalid_request_error", param, 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_exc(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_: oa.ErrorType = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = f"{exc.detail}: {req.method} {req.url.path}"
        return reply(exc.status_code, message, type_, None, exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(_req: Request, exc: Exception) -> JSONResponse:
        # The last resort (uvicorn still logs the traceback): the client gets JSON it can parse, not plain text.
        return reply(500, f"internal server error ({type(exc).__name__}); the server log has the details",
                     "server_error", None, 500)


def _validation_message(errors: Sequence[Any]) -> tuple[str | None, str]:
    """(param, message) for the first pydantic / JSON error of a request body."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    # not "body", nor a union member's tag such as "dict[str,any]" (pydantic puts it in loc)
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and "[" not in str(p)]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", first.get("msg"))
        return None, f"the request body is not valid JSON: {detail} (at character {loc[0] if loc else 0})"
    if not loc and first.get("type") in ("model_attributes_type", "dict_type", "missing"):
        return None, "the request body must be a JSON object (send Content-Type: application/json)"
    param = ".".join(loc) or None
    return param, f"{param}: {first['msg']}" if param else str(first["msg"])


def install_auth(app: FastAPI, api_key: str | None) -> None:
    if not api_key:
        return
    expected = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        if request.url.path.startswith("/v1"):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                body = oa.error_body("Incorrect or missing API key (send 'Authorization: Bearer <key>')",
                                     "authentication_error", code="invalid_api_key")
                return JSONResponse(body, status_code=401)
        return await call_next(request)
