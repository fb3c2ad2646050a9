"""Orchestration over the domain packages: compile (resolve -> key -> lock -> prepare -> build in staging ->
publish), full verification (contents + this machine's toolchain), and which artifact a server loads."""

from neuronpack.pipeline.compile import CompileResult, compile_model
from neuronpack.pipeline.serving import resolve_serving_artifact
from neuronpack.pipeline.verify import verify_artifact

__all__ = ["CompileResult", "compile_model", "resolve_serving_artifact", "verify_artifact"]
