"""JSON under a grammar ends: the digits of a number part (integer, fraction, exponent) and the whitespace a schema's
x-guidance allows are bounded, sampled at temperature 1 from logits that love digits (or whitespace) through the real
llguidance matcher; and every JSON document a client would expect (what json.dumps writes: float64 reprs, int64s,
strings full of digits, pretty-printed with flexible whitespace) stays reachable token by token."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from neuronpack.runtime.structured import Constraint, GrammarCompiler, GrammarSpec, mask_logits
from neuronpack.runtime.structured.json_bounds import EXPONENT, FRACTION, INT, MAX_DIGITS, START, scan
from neuronpack.runtime.structured.matcher import _words
from tests.fuzz import fuzz_settings

MAX_TOKENS = 400
NUMBER_PART = re.compile(r"-?(\d*)(?:\.(\d*))?(?:[eE][+-]?(\d*))?")
NUMBERS = [
    {"type": "number"},
    {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "integer"}}, "required": ["a", "b"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "number"}, "maxItems": 3},
]
# Strings without control characters: llguidance's JSON strings refuse a raw DEL (which json.dumps leaves raw) and
# escapes it does not need; that is llguidance's string policy, not the bound tested here.
text = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=30)
json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | st.integers(-2**63, 2**64)
    | text | st.from_regex(r"[0-9]{20,40}", fullmatch=True),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def setup(tokenizer_dir):
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    tok = ArtifactTokenizer.from_dir(tokenizer_dir)
    grammars = GrammarCompiler(tok.to_json_str, vocab_size=tok.vocab_size, eos_token_ids=[tok.eos_token_id])
    return grammars, tok


def constraint(grammars, tok, schema, *, bounded: bool = True) -> Constraint:
    grammar = grammars.compile(GrammarSpec.json_schema(schema, param="response_format"))
    return Constraint(grammar.new_matcher(), tok.vocab_size, grammar.bound if bounded else None)


def biased_logits(tok, pattern: str) -> torch.Tensor:
    """+10 on every token whose text matches ``pattern`` entirely: a model that loves digits (or whitespace)."""
    bias = torch.zeros(tok.vocab_size)
    for token in range(tok.vocab_size):
        text = tok.decode([token])
        if text and re.fullmatch(pattern, text):
            bias[token] = 10.0
    return bias


def sample(c: Constraint, tok, bias: torch.Tensor, seed: int) -> tuple[str, bool]:
    """Temperature-1 sampling of N(0, 1) + bias logits under ``c``: (text, whether it ended before MAX_TOKENS)."""
    gen = torch.Generator().manual_seed(seed)
    out: list[int] = []
    for _ in range(MAX_TOKENS):
        logits = mask_logits((torch.randn(1, tok.vocab_size, generator=gen) + bias), [c])[0]
        token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        if token == tok.eos_token_id and c.matcher.is_accepting():
            return tok.decode(out), True
        assert c.consume(token), c.error
        out.append(token)
        if c.done:
            return tok.decode(out), True
    return tok.decode(out), False


def number_parts(text: str) -> list[tuple[int, int, int]]:
    """(integer, fraction, exponent) digit counts of every number in a JSON text without strings holding digits."""
    return [tuple(len(g or "") for g in m.groups()) for m in NUMBER_PART.finditer(text) if m.group(0)]


@pytest.mark.parametrize("schema", NUMBERS, ids=["number", "object", "array"])
def test_digit_loving_sampling_at_temperature_1_ends_within_the_bounds(setup, schema):
    grammars, tok = setup
    digits = biased_logits(tok, r"[0-9]+")
    unbounded = [sample(constraint(grammars, tok, schema, bounded=False), tok, digits, seed) for seed in range(4)]
    assert not any(ended for _, ended in unbounded)  # the failure: numbers run until max_tokens
    for seed in range(12):
        text, ended = sample(constraint(grammars, tok, schema), tok, digits, seed)
        assert ended, text
        json.loads(text)
        for integer, fraction, exponent in number_parts(text):
            assert integer <= MAX_DIGITS[INT] and fraction <= MAX_DIGITS[FRACTION] and exponent <= MAX_DIGITS[EXPONENT]


def test_flexible_whitespace_from_x_guidance_is_bounded(setup):
    grammars, tok = setup
    schema = {"x-guidance": {"whitespace_flexible": True}, "type": "object",
              "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}, "required": ["a", "b"],
              "additionalProperties": False}
    spaces = biased_logits(tok, r"\s+")
    for seed in range(6):
        text, ended = sample(constraint(grammars, tok, schema), tok, spaces, seed)
        assert ended, text
        assert json.loads(text).keys() == {"a", "b"}
        assert max(map(len, re.findall(r"\s+", text))) <= 32
    pretty = json.dumps({"a": True, "b": None}, indent=4)
    assert accepted(constraint(grammars, tok, schema), tok, pretty)


def accepted(c: Constraint, tok, text: str) -> bool:
    """Whether every token of ``text`` is allowed by the mask before it, and the grammar is complete after it."""
    for token in tok.encode(text, add_special_tokens=False):
        words = torch.empty(1, _words(tok.vocab_size), dtype=torch.int32)
        c.fill(words, 0)
        if not (int(words[0, token // 32]) >> (token % 32)) & 1 or not c.consume(token):
            return False
    return c.matcher.is_accepting()


@fuzz_settings(60)
@given(value=json_values)
def test_what_json_dumps_writes_stays_reachable(setup, value):
    grammars, tok = setup
    dumped = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert accepted(constraint(grammars, tok, {}), tok, dumped), dumped


@fuzz_settings(300)
@given(value=json_values)
def test_the_scanner_finds_no_overlong_number_in_json_dumps_output(value):
    assert scan(START, json.dumps(value).encode())[1] is False


@pytest.mark.parametrize("number, exceeded", [
    ("1." + "0" * 24, False), ("1." + "0" * 25, True), ("9" * 24, False), ("9" * 25, True), ("1e-308", False),
    ("1E+1000", True), ('"' + "1" * 99 + '"', False), ('{"k\\"1":-0.5e12}', False),
])
def test_scanner_bounds(number, exceeded):
    assert scan(START, number.encode())[1] is exceeded


def test_a_draft_past_the_bound_is_trimmed_and_masked(setup):
    grammars, tok = setup
    c = constraint(grammars, tok, {"type": "number"})
    prefix = tok.encode("1." + "0" * MAX_DIGITS[FRACTION], add_special_tokens=False)
    for token in prefix:
        assert c.consume(token)
    zero = tok.encode("0", add_special_tokens=False)
    assert c.trim(zero * 3) == 0  # a speculative draft of more zeros is cut at once
    masks = c.masks_along([])
    assert not masks[0, zero[0]] and masks[0, tok.encode("e", add_special_tokens=False)[0]]
    assert np.asarray(masks).any()
