"""The engine: continuous batching over a compiled model's KV rows, and nothing about HTTP.

``core.py`` (the Engine: each step's schedule / execute / update), ``scheduler.py`` (waiting queue, fork groups, the
StepPlans), ``plan.py`` (StepPlan as data), ``kv_rows.py`` (RowAllocator: the one owner of KV rows) over
``prefix_cache.py`` (the block-hash index), ``runner.py`` (a plan run on the CompiledModel), ``requests.py``
(requests, outputs, the CompiledModel protocol), ``admission.py``, ``metrics.py``, ``sampling.py``, ``logprobs.py``,
``stopping.py``, and ``speculation/`` (draft-then-verify). Grammars come from ``runtime/structured/`` below it; the
HTTP face (``runtime/openai/``) sits above it and is never imported from here (pyproject's import-linter contract).

The names below are imported from their modules on first use (``neuronpack.lazy``): importing a submodule such as
``sampling`` does not import the engine loop or torch.

Example::

    from neuronpack.runtime.engine import Engine, GenerationRequest
"""

from neuronpack.lazy import lazy_attributes

_EXPORTS = {
    "Engine": "core",
    "EngineLimits": "requests",
    "EngineSummary": "requests",
    "GenerationRequest": "requests",
    "GenerationResult": "requests",
    "StepOutput": "requests",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_attributes(__name__, _EXPORTS)
