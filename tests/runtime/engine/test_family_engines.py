"""The engine's features on Qwen3 and Gemma 3 artifacts (AOTInductor, tests/helpers/family_artifacts.py: batch 4,
prompts of up to 64 tokens per call, seq_len 128; Gemma 3's sliding layers keep rings of 8 + 3 positions): greedy
tokens are transformers' through chunked prefill, prefix caching (Gemma 3: reuse only where a ring still holds the
window, no block pool), parallel samples, prompt-lookup speculation (drafts rejected: written into the rings' spare
positions) and structured outputs."""

from __future__ import annotations

import random
from functools import cache

import pytest
import transformers

from neuronpack.runtime.engine import Engine, GenerationRequest
from neuronpack.runtime.engine.metrics import metric_value
from neuronpack.runtime.engine.prefix_cache import PrefixCaching
from neuronpack.runtime.engine.sampling import SamplingParams
from neuronpack.runtime.engine.speculation.config import SpeculationConfig
from neuronpack.runtime.structured import GrammarSpec
from tests.backends.torch_aot.test_generate import hf_greedy
from tests.runtime.serving import run_all

pytestmark = pytest.mark.slow
FAMILIES = ["qwen3", "gemma3"]
GREEDY = SamplingParams(temperature=0.0)
PREFIX = [random.Random(55).randrange(3, 380) for _ in range(40)]  # two full blocks and 8 more
LOOKUP = SpeculationConfig("prompt_lookup", 3, prompt_lookup_min=1, prompt_lookup_max=3)


@cache
def _loaded(path):
    from neuronpack.backends.torch_aot import load_artifact
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    return load_artifact(path), ArtifactTokenizer.from_dir(path)


@cache
def _reference(checkpoint):
    return transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()


@pytest.fixture(params=FAMILIES)
def family(request, family_artifact):
    """(name, loaded artifact, tokenizer, transformers model) of one family's shared artifact."""
    art = family_artifact(request.param)
    return (request.param, *_loaded(art.path), _reference(art.checkpoint))


def ask(prompt, max_tokens=12, **kwargs) -> GenerationRequest:
    return GenerationRequest(prompt_ids=tuple(prompt), max_tokens=max_tokens, ignore_eos=True, sampling=GREEDY,
                             **kwargs)


def hits(engine) -> float:
    return metric_value(engine.metrics.render().decode(), "neuronpack_prefix_cache_hits_total")


def test_chunked_prefill_and_prefix_caching_give_transformers_tokens(family):
    name, lm, tok, reference = family
    engine = Engine(lm, tok)
    ringed = name == "gemma3"
    assert (engine.scheduler.rows.cache_blocks == 0) is ringed  # rings keep no block pool
    long = [random.Random(7).randrange(3, 380) for _ in range(100)]  # two chunks of at most 64
    first = engine.generate(ask(long)).token_ids
    assert first == hf_greedy(reference, long, 12)
    turn = [*long, *first, 11, 12]  # the next chat turn continues the row: its KV (rings too) is whole
    assert engine.generate(ask(turn, 8)).token_ids == hf_greedy(reference, turn, 8)
    assert hits(engine) == len(long) + len(first) - 1
    before = hits(engine)
    engine.generate(ask([*PREFIX, 5, 6, 7]))
    other = [*PREFIX, 9, 10]  # shares 40 tokens with a row that went on: a ring no longer holds their window
    assert engine.generate(ask(other)).token_ids == hf_greedy(reference, other, 12)
    assert hits(engine) - before == (0 if ringed else 40)
    forked = [ask(PREFIX[:30]), ask(PREFIX[:30])]  # parallel samples: the leader's KV (rings too) copied
    outputs = {r.request_id: [] for r in forked}
    engine.submit_forks(forked, [lambda out, rid=r.request_id: outputs[rid].extend(out.token_ids) for r in forked])
    while engine.step():
        pass
    assert list(outputs.values()) == [hf_greedy(reference, PREFIX[:30], 12)] * 2
    grammar = engine.grammars.compile(GrammarSpec("regex", "(yes|no|maybe)", "guided_regex"))
    assert engine.generate(ask(turn, 8, grammar=grammar)).text in ("yes", "no", "maybe")
    assert engine.scheduler.idle and engine.scheduler.free_rows == 4


def test_prompt_lookup_speculation_gives_transformers_tokens(family):
    name, lm, tok, reference = family
    engine = Engine(lm, tok, speculation=LOOKUP, prefix_caching=PrefixCaching(enabled=False))
    texts = ["abc abc abc abc abc abc", "one two one two one two one", "1 2 3 1 2 3 1 2 3", "The quick brown fox"]
    requests = [ask(tok.encode(t), 40 + 3 * i) for i, t in enumerate(texts)]
    got = run_all(engine, requests)
    for r in requests:
        assert got[r.request_id] == hf_greedy(reference, list(r.prompt_ids), r.max_tokens), f"{name}: {r}"
    text = engine.metrics.render().decode()
    drafted = metric_value(text, "neuronpack_spec_decode_num_draft_tokens_total")
    accepted = metric_value(text, "neuronpack_spec_decode_num_accepted_tokens_total")
    assert drafted > accepted  # drafts were rejected: their KV went into the rings' spare positions
