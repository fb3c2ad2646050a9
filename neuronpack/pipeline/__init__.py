"""Compile orchestration: resolve model -> plan -> key -> lock -> build in staging -> publish."""

from neuronpack.pipeline.compile import CompileResult, compile_model

__all__ = ["CompileResult", "compile_model"]
