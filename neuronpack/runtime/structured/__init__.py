"""Structured outputs: grammars compiled with llguidance (``grammar``), per-request matchers and logit masks
(``matcher``), the OpenAI / vLLM request fields that ask for them (``fields``) and tool calling (``tools``,
``tool_stream``)."""

from neuronpack.runtime.structured.grammar import CompiledGrammar, GrammarCompiler, GrammarSpec
from neuronpack.runtime.structured.matcher import Constraint, Masks, mask_logits

__all__ = ["CompiledGrammar", "Constraint", "GrammarCompiler", "GrammarSpec", "Masks", "mask_logits"]
