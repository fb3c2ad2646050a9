"""Grammar compilation: the cache (by spec, not by the field it came from; least recently used evicted), errors that
name the field, and the masks a matcher gives along a draft (what speculation verifies against)."""

import pytest
import torch

from neuronpack.errors import InvalidRequestError
from neuronpack.runtime.structured import Constraint, GrammarCompiler, GrammarSpec, ReasoningGate, mask_logits


@pytest.fixture(scope="module")
def compiler(tokenizer_dir):
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    tok = ArtifactTokenizer.from_dir(tokenizer_dir)
    return GrammarCompiler(tok.to_json_str, vocab_size=tok.vocab_size, eos_token_ids=[tok.eos_token_id],
                           cache_size=2), tok


def test_the_cache_is_keyed_by_spec_and_evicts_the_oldest(compiler):
    grammars, _ = compiler
    a = grammars.compile(GrammarSpec("regex", "a+", "guided_regex"))
    assert grammars.compile(GrammarSpec("regex", "a+", "structured_outputs.regex")) is a  # same grammar, other field
    grammars.compile(GrammarSpec("regex", "b+", "guided_regex"))
    grammars.compile(GrammarSpec("regex", "c+", "guided_regex"))  # cache of 2: "a+" goes
    misses = grammars.misses
    assert grammars.compile(GrammarSpec("regex", "a+", "guided_regex")) is not a and grammars.misses == misses + 1


def test_compile_errors_name_the_field(compiler):
    grammars, _ = compiler
    with pytest.raises(InvalidRequestError, match="the JSON Schema does not compile") as exc:
        grammars.compile(GrammarSpec.json_schema({"properties": {"a": {"$ref": "#/$defs/b"}}}, param="guided_json"))
    assert exc.value.param == "guided_json" and "/$defs/b" in str(exc.value)
    with pytest.raises(InvalidRequestError, match="must be an object") as exc:
        GrammarSpec.json_schema([1], param="response_format.json_schema.schema")


def test_masks_along_a_draft_follow_the_grammar_and_roll_back(compiler):
    grammars, tok = compiler
    constraint = Constraint(grammars.compile(GrammarSpec("regex", "ab|ac", "guided_regex")).new_matcher(),
                            tok.vocab_size)
    a, b, c = (tok.encode(x, add_special_tokens=False)[0] for x in "abc")
    masks = constraint.masks_along([a])
    assert masks.shape == (2, tok.vocab_size)
    assert masks[0].nonzero()[0].tolist() == [a]
    assert set(masks[1].nonzero()[0].tolist()) == {b, c}
    assert constraint.trim([a, b, a]) == 2  # "aba" is cut after "ab"
    logits = mask_logits(torch.zeros(2, tok.vocab_size), [constraint, None])  # the matcher is back at the start
    assert torch.isinf(logits[0]).sum() == tok.vocab_size - 1 and not torch.isinf(logits[1]).any()
    assert constraint.consume(a) and constraint.consume(b) and constraint.done


def test_a_gated_grammar_lets_the_reasoning_through_then_applies(compiler):
    """vLLM's reasoning + structured outputs: free tokens up to and including the end sequence (here "x y", its
    first token already in the prompt's tail), the grammar from the next token on; drafts across the end too."""
    grammars, tok = compiler
    a, b, c, x, y = (tok.encode(t, add_special_tokens=False)[0] for t in "abcxy")
    grammar = grammars.compile(GrammarSpec("regex", "ab|ac", "guided_regex"))
    gate = ReasoningGate.after_prompt((x, y), [c, x], ended=False)
    assert gate.tail == (x,)

    def gated():
        return grammar.after(gate).constraint(tok.vocab_size)

    constraint = gated()
    assert constraint.gated and not constraint.active and not constraint.done
    assert torch.isfinite(mask_logits(torch.zeros(1, tok.vocab_size), [constraint])).all()  # nothing refused
    assert constraint.consume(c) and constraint.consume(x) and constraint.gated  # "x" then "c x": not "x y" yet
    assert constraint.consume(y) and constraint.active  # the end: the grammar applies from here
    assert not torch.isinf(mask_logits(torch.zeros(1, tok.vocab_size), [constraint])[0, a])
    assert constraint.consume(a) and constraint.consume(b) and constraint.done

    draft = [c, c, x, y, a, b, a]
    assert gated().trim(draft) == 6  # free up to "x y" (4 tokens), then "ab"; the third "a" is refused
    masks = gated().masks_along(draft[:6])
    assert masks[:4].all()  # the reasoning's own positions allow everything
    assert masks[4].nonzero()[0].tolist() == [a] and set(masks[5].nonzero()[0].tolist()) == {b, c}
    assert gated().trim([c, c, x]) == 3 and gated().masks_along([c, x]).all()  # still reasoning
    ended = grammar.after(ReasoningGate((x, y), (), ended=True)).constraint(tok.vocab_size)
    assert ended.active and ended.trim([x, y]) == 0  # the prompt closed the reasoning: constrained at once
