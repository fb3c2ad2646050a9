"""The grammar library of structured outputs: grammars compiled with llguidance and cached by spec (``grammar``),
per-request matchers and logit masks (``matcher``), the digit bound of JSON numbers (``json_bounds``). The request
fields that ask for grammars (response_format, tools) are the HTTP face's: runtime/openai/structured_fields.py and
tools.py."""

from neuronpack.runtime.structured.grammar import CompiledGrammar, GrammarCompiler, GrammarSpec
from neuronpack.runtime.structured.matcher import Constraint, Masks, ReasoningGate, mask_logits

__all__ = ["CompiledGrammar", "Constraint", "GrammarCompiler", "GrammarSpec", "Masks", "ReasoningGate", "mask_logits"]
