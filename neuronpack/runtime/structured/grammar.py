"""Grammars for constrained decoding, compiled with llguidance and cached by their source.

A ``GrammarSpec`` says what the output must match: a JSON Schema, any JSON object, a regex, one of fixed strings, or
a Lark / GBNF grammar. ``GrammarCompiler.compile`` turns it into a ``CompiledGrammar`` (an llguidance matcher in its
start state) once per distinct spec; each request then gets its own matcher copied from it (``new_matcher``), which
costs microseconds. Compiling is the expensive part (the tokenizer's token trie is built once, on first use), so the
HTTP server runs it on its worker threads, never on the engine loop: a request reaches the engine with its grammar
compiled. A spec the library cannot compile raises ``InvalidRequestError`` naming the request field (HTTP 400).

JSON is generated compact (no whitespace between tokens): small models given free whitespace tend to spend their
budget on newlines, and compact JSON is what every parser reads. A schema whose top-level ``x-guidance`` asks for
``whitespace_flexible`` gets it bounded (``BOUNDED_WHITESPACE``: at most 32 whitespace characters where JSON allows
them, enough for pretty-printed JSON 15 levels deep); a ``whitespace_pattern`` or separators a client writes itself
are its own regexes, kept as given. The digits of JSON numbers are bounded by the matcher (``json_bounds.py``:
llguidance has no option for them), so a JSON Schema's grammar carries the tokenizer's ``NumberBound``.

Example::

    compiler = GrammarCompiler(tokenizer.to_json_str, vocab_size=49152, eos_token_ids=[2])
    grammar = compiler.compile(GrammarSpec.json_schema({"type": "object"}, param="response_format"))
    matcher = grammar.new_matcher()
    constraint = grammar.after(ReasoningGate((end_think_id,))).constraint(vocab_size)   # free until </think>
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from neuronpack.errors import InvalidRequestError
from neuronpack.runtime.structured.matcher import Constraint, ReasoningGate

if TYPE_CHECKING:
    import llguidance

    from neuronpack.runtime.structured.json_bounds import NumberBound

GrammarKind = Literal["json_schema", "regex", "choice", "grammar"]
CACHE_SIZE = 256  # distinct grammars kept compiled (a start-state matcher each: kilobytes to a few MB)
COMPACT_JSON = {"whitespace_flexible": False}
# llguidance matches the pattern at most once where JSON allows whitespace, so its bound holds.
BOUNDED_WHITESPACE = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{1,32}"}


@dataclass(frozen=True)
class GrammarSpec:
    """What the output must match. ``source``: the canonical JSON of a schema, a regex, the JSON list of choices, or
    a grammar's text. ``param`` (the request field it came from) names it in errors and is not part of the key."""

    kind: GrammarKind
    source: str
    param: str = field(default="response_format", compare=False)

    @classmethod
    def json_schema(cls, schema: Any, *, param: str) -> GrammarSpec:
        """A JSON Schema given as a dict (or a JSON string of one)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise InvalidRequestError(f"{param}: the schema is not valid JSON: {exc}", param=param) from None
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequestError(f"{param}: a JSON Schema must be an object, got {type(schema).__name__}",
                                      param=param)
        # Key order is kept: it is the order the properties are generated in.
        return cls("json_schema", json.dumps(schema, separators=(",", ":")), param)

    @classmethod
    def json_object(cls, *, param: str) -> GrammarSpec:
        """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls.json_schema({"type": "object"}, param=param)

    @classmethod
    def choice(cls, choices: list[str], *, param: str) -> GrammarSpec:
        if not choices or not all(isinstance(c, str) for c in choices):
            raise InvalidRequestError(f"{param}: give a non-empty list of strings", param=param)
        return cls("choice", json.dumps(choices), param)


class CompiledGrammar:
    """A compiled grammar: a matcher in its start state that each request copies, and for JSON the bound on the
    digits of its numbers (None for other grammars). ``gate``: it applies once a reasoning ends (``after``)."""

    def __init__(self, spec: GrammarSpec, pristine: llguidance.LLMatcher, bound: NumberBound | None = None,
                 gate: ReasoningGate | None = None) -> None:
        self.spec = spec
        self._pristine = pristine
        self.bound = bound
        self.gate = gate

    def new_matcher(self) -> llguidance.LLMatcher:
        return self._pristine.deep_copy()

    def after(self, gate: ReasoningGate | None) -> CompiledGrammar:
        """This grammar, applying once ``gate`` opens (the compiled matcher is shared, not copied)."""
        return self if gate is None else CompiledGrammar(self.spec, self._pristine, self.bound, gate)

    def constraint(self, vocab_size: int) -> Constraint:
        """A request's grammar state (a fresh matcher)."""
        return Constraint(self.new_matcher(), vocab_size, self.bound, self.gate)


class GrammarCompiler:
    """Compiles ``GrammarSpec``s for one tokenizer (``tokenizer_json`` gives its tokenizer.json text, asked for on
    the first compile), keeping the last ``cache_size`` of them. Thread-safe."""

    def __init__(self, tokenizer_json: Callable[[], str], *, vocab_size: int, eos_token_ids: list[int],
                 cache_size: int = CACHE_SIZE) -> None:
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._bound: NumberBound | None = None
        self._cache: OrderedDict[GrammarSpec, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """The compiled grammar of ``spec`` (from the cache when it was compiled before). InvalidRequestError (HTTP
        400, naming ``spec.param``) when it does not compile: a bad schema, an unknown $ref, a bad regex."""
        with self._lock:
            cached = self._cache.get(spec)
            if cached is not None:
                self._cache.move_to_end(spec)
                self.hits += 1
                return cached
        bound = self.number_bound() if spec.kind == "json_schema" else None
        compiled = CompiledGrammar(spec, self._matcher(spec), bound)  # outside the lock: compiles run side by side
        with self._lock:
            self.misses += 1
            self._cache[spec] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _matcher(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        import llguidance

        try:
            text = _grammar_text(spec)
        except Exception as exc:  # the GBNF converter raises a bare Exception, the schema reader ValueError
            raise InvalidRequestError(f"{spec.param}: {_first_line(str(exc))}", param=spec.param) from None
        matcher = llguidance.LLMatcher(self.tokenizer(), text, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"{spec.param}: the {_what(spec.kind)} does not compile: "
                                      f"{_first_line(matcher.get_error())}", param=spec.param,
                                      fix="Fix the field (docs/serve.md, Structured outputs, says what is supported)")
        matcher.compute_bitmask()  # builds the start state's lexer here, not on the engine loop at the first step
        return matcher

    def number_bound(self) -> NumberBound:
        """The digit bound of JSON numbers for this tokenizer (built on first use: every token's bytes, ~12 ms for
        49k tokens)."""
        tokenizer = self.tokenizer()
        with self._lock:
            if self._bound is None:
                from neuronpack.runtime.structured.json_bounds import NumberBound, token_bytes

                self._bound = NumberBound(token_bytes(tokenizer, self.vocab_size))
            return self._bound

    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer (built on first use: ~0.3 s for a 49k vocabulary)."""
        with self._lock:
            if self._tokenizer is None:
                import llguidance

                self._tokenizer = llguidance.LLTokenizer(self._tokenizer_json(), n_vocab=self.vocab_size,
                                                         eos_token=self._eos)
            return self._tokenizer


def _grammar_text(spec: GrammarSpec) -> str:
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if spec.kind == "json_schema":
        return LLMatcher.grammar_from_json_schema(spec.source, defaults=COMPACT_JSON,
                                                  overrides=_whitespace_overrides(json.loads(spec.source)))
    if spec.kind == "regex":
        return LLMatcher.grammar_from_regex(spec.source)
    if spec.kind == "choice":  # Lark string literals are JSON strings
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in json.loads(spec.source)))
    return LLMatcher.grammar_from_lark(any_to_lark(spec.source))  # vLLM's guided_grammar: EBNF (GBNF) or Lark


def _whitespace_overrides(schema: Any) -> dict[str, Any] | None:
    """Bounded whitespace for a schema whose ``x-guidance`` asks for flexible (unbounded) whitespace."""
    options = schema.get("x-guidance") if isinstance(schema, dict) else None
    if isinstance(options, dict) and options.get("whitespace_flexible") is True and \
            options.get("whitespace_pattern") is None:
        return BOUNDED_WHITESPACE
    return None


def _what(kind: GrammarKind) -> str:
    return {"json_schema": "JSON Schema", "regex": "regex", "choice": "choice list", "grammar": "grammar"}[kind]


def _first_line(message: str) -> str:
    # llguidance's messages quote the grammar with a caret under the error: keep the words only, on one line.
    lines = [line.strip() for line in message.strip().splitlines()]
    words = [line for line in lines if line and line != "^" and not re.match(r"^\d+ \|", line)]
    return " ".join(words[:4]) if words else "unknown error"
