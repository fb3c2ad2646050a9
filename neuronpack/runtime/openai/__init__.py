"""The runtime's HTTP face: an OpenAI-compatible server over the engine (vLLM's entrypoints/openai).

``server.py`` (the routes and ``create_app``), ``schema.py`` (request validation; refused fields by name),
``responses.py`` (OpenAI's response and chunk shapes), ``sse.py`` (streams), ``streams.py`` (the engine thread to
asyncio), ``http_errors.py`` (OpenAI-shaped errors, auth), ``http_limits.py`` (body cap, graceful shutdown),
``openapi.py`` (the published document), ``chat_prompt.py`` (chat templates and request grammars, off the event
loop), ``memory.py`` (glibc arenas and heap release for a long-running server), ``request_log.py`` (``serve
--request-log``: a JSON line per finished request, the format ``buckets plan`` reads), and the request fields that
ask for structured outputs and tools: ``structured_fields.py``, ``tools.py``, ``tool_stream.py`` (their grammars come
from ``runtime/structured/``); how the model chats: ``chat_format.py`` (the chat template, Hermes tools),
``reasoning.py`` (``serve --reasoning-parser``: reasoning_content), ``harmony.py`` and ``harmony_stream.py``
(gpt-oss's harmony format).

Nothing below (``runtime/engine/``, ``runtime/structured/``) imports this package (pyproject's import-linter
contract).
"""
