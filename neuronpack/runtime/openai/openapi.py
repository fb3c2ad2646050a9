"""The OpenAPI document the server publishes (``GET /openapi.json``), made true to what it serves:

- the ``model`` field of every request body is an enum of the served model names, so API fuzzers (schemathesis) and
  client generators produce requests that reach the engine instead of stopping at "unknown model";
- POST routes answer JSON, or server-sent events (``text/event-stream``) with ``"stream": true``;
- the error responses are the ones the server really sends, in OpenAI's shape (400 instead of FastAPI's 422, 401 with
  an API key, 404 unknown model, 413 body too large, 503 queue full / shutting down, 504 past the request deadline).

Example::

    declare_served_models(app, ["smollm2"], with_api_key=False)
    app.openapi()["components"]["schemas"]["CompletionRequest"]["properties"]["model"]["enum"]   # ["smollm2"]
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"type": ["string", "null"]},
            "code": {"type": ["string", "integer", "null"]},
        },
    }},
}
_ERRORS = {
    "400": "invalid request (bad JSON, a field that fails validation, a prompt too long, an unsupported option)",
    "404": "unknown model or route",
    "413": "request body larger than --max-body-bytes",
    "500": "the model failed while generating",
    "503": "waiting queue full (--max-waiting) or shutting down; see Retry-After",
    "504": "the request ran past --request-timeout",
}


def declare_served_models(app: FastAPI, names: list[str], *, with_api_key: bool) -> None:
    """Replace ``app.openapi`` with a generator that declares ``names`` and the real error responses."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _declare(schema, names, with_api_key)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _declare(schema: dict[str, Any], names: list[str], with_api_key: bool) -> None:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_SCHEMA
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    error_ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            if path == "/metrics":
                responses["200"]["content"] = {"text/plain": {"schema": {"type": "string"}}}
            if with_api_key and path.startswith("/v1"):
                responses["401"] = {"description": "wrong or missing API key", **error_ref}
            body_ref = (operation.get("requestBody", {}).get("content", {}).get("application/json", {})
                        .get("schema", {}).get("$ref"))
            if not body_ref:
                continue
            # With "stream": true the same route answers with server-sent events.
            # Each event is {"event", "data"}: data is a JSON chunk (or "[DONE]"), as schemathesis reads SSE.
            event = {"type": "object", "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}
            responses["200"]["content"] = {"application/json": {"schema": {"type": "object"}},
                                           "text/event-stream": {"schema": event}}
            for status, description in _ERRORS.items():
                responses[status] = {"description": description, **error_ref}
            model = components.get(body_ref.rsplit("/", 1)[-1], {}).get("properties", {}).get("model")
            if model is not None:
                model["enum"] = list(names)
