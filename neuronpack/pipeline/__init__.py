"""Orchestration over the domain packages: compile (resolve -> key -> lock -> prepare -> build in staging ->
publish), full verification (contents + this machine's toolchain), and which artifact a server loads.

The names are imported from their modules on first use (``neuronpack.lazy``), so a cache-hit compile never loads
the serving path."""

from neuronpack.lazy import lazy_attributes

_EXPORTS = {
    "CompileResult": "compile",
    "compile_model": "compile",
    "resolve_serving_artifact": "serving",
    "verify_artifact": "verify",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_attributes(__name__, _EXPORTS)
