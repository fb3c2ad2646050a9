"""Prefix caching and chunked prefill on a real compiled artifact (batch 4, context buckets [16, 64], seq_len 128):
greedy tokens are transformers' and the same with the cache on or off, whatever is reused (in place, from the block
pool, across parallel samples, speculation, structured outputs, prompt logprobs); the counters say what was reused;
rows keep prompts sent one at a time; a stream gets a token every step while a long prompt is prefilled in chunks;
random arrivals, pool and step budgets never emit a wrong token, pass a budget or leak a row."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuronpack.runtime.engine import Engine, EngineLimits, GenerationRequest
from neuronpack.runtime.engine.metrics import metric_value
from neuronpack.runtime.engine.prefix_cache import PrefixCaching
from neuronpack.runtime.engine.sampling import SamplingParams
from neuronpack.runtime.structured import GrammarSpec
from tests.runtime.serving import hf_greedy, hf_logits, run_all

GREEDY = SamplingParams(temperature=0.0)
OFF = PrefixCaching(enabled=False)
PREFIX = [random.Random(39).randrange(3, 380) for _ in range(40)]  # 40 tokens: two full blocks and 8 more


def request(prompt, max_tokens=12, **kwargs) -> GenerationRequest:
    kwargs.setdefault("sampling", GREEDY)
    return GenerationRequest(prompt_ids=tuple(prompt), max_tokens=max_tokens, ignore_eos=True, **kwargs)


def counters(engine) -> tuple[float, float]:
    text = engine.metrics.render().decode()
    return (metric_value(text, "neuronpack_prefix_cache_queries_total"),
            metric_value(text, "neuronpack_prefix_cache_hits_total"))


@pytest.fixture
def cached(compiled_lm, artifact_tokenizer) -> Engine:
    return Engine(compiled_lm, artifact_tokenizer)


def test_a_shared_prefix_is_reused_and_the_tokens_are_transformers(cached, tiny_llama):
    a, b = [*PREFIX, 5, 6, 7], [*PREFIX, 9, 10]
    first = cached.generate(request(a)).token_ids
    assert counters(cached) == (len(a), 0)
    second = cached.generate(request(b)).token_ids  # a's row: positions 0..39 kept, b prefilled from 40
    assert counters(cached) == (len(a) + len(b), 40)
    assert first == hf_greedy(tiny_llama, a, 12) and second == hf_greedy(tiny_llama, b, 12)
    again = cached.generate(request(b)).token_ids  # the same prompt: all but its last token
    assert again == second and counters(cached)[1] == 40 + len(b) - 1
    # A follow-up turn: the prompt is the last one plus its completion plus more; generated tokens' KV is reused.
    turn = [*b, *second, 11, 12]
    assert cached.generate(request(turn)).token_ids == hf_greedy(tiny_llama, turn, 12)
    assert counters(cached)[1] == 40 + len(b) - 1 + len(b) + len(second) - 1
    assert cached.scheduler.idle and cached.scheduler.free_rows == 4


def test_the_prefix_caches_bytes_never_exceed_its_budget(compiled_lm, artifact_tokenizer):
    """Waves of 4 prompts (the batch), each wave with 4 prefixes of its own (2 full blocks each): every wave's rows
    push the previous wave's prefixes into the pool of 5 blocks the budget buys, evicting older ones. After every
    step the usage gauge is whole blocks within the budget, which is said in whole blocks too; it fills the pool,
    and the newest prefixes are the ones found again."""
    block = 16 * compiled_lm.kv_token_bytes
    engine = Engine(compiled_lm, artifact_tokenizer, prefix_caching=PrefixCaching(memory_mib=5.5 * block / 2**20))
    assert engine.summary().cache_blocks == 5 and "5 blocks of 16 tokens" in engine.summary().prefix_cache_line()
    prefixes = [[random.Random(seed).randrange(3, 380) for _ in range(33)] for seed in range(16)]
    usage = []
    for wave in range(4):
        for prefix in prefixes[4 * wave: 4 * wave + 4]:
            engine.submit(request([*prefix, 1], 4), lambda out: None)
        while engine.step():
            text = engine.metrics.render().decode()
            usage.append(metric_value(text, "neuronpack_prefix_cache_usage_bytes"))
            assert metric_value(text, "neuronpack_prefix_cache_budget_bytes") == 5 * block
    assert max(usage) == 5 * block and all(u % block == 0 and u <= 5 * block for u in usage)
    hits = counters(engine)[1]
    engine.generate(request([*prefixes[0], 2], 1))  # the first wave's prefixes were evicted long ago
    assert counters(engine)[1] == hits
    engine.generate(request([*prefixes[15], 2], 1))  # the last wave's are in the batch's free rows
    assert counters(engine)[1] == hits + 33


def test_a_budget_below_a_few_blocks_is_said_and_keeps_prefixes_in_free_rows(compiled_lm, artifact_tokenizer):
    block = 16 * compiled_lm.kv_token_bytes
    engine = Engine(compiled_lm, artifact_tokenizer, prefix_caching=PrefixCaching(memory_mib=2 * block / 2**20))
    line = engine.summary().prefix_cache_line()
    assert "holds 2 blocks of 16 tokens" in line and "too few" in line and "give it" in line
    engine.generate(request([*PREFIX, 1], 2))
    engine.generate(request([*PREFIX, 2], 2))
    assert counters(engine)[1] == 40


def test_prompts_sent_one_at_a_time_keep_their_rows_and_the_first_hits_again(compiled_lm, artifact_tokenizer):
    """The issue's case, with no pool at all: four distinct prompts one at a time each take an empty row and leave
    their prefix there; the first, sent again, finds all but its last token."""
    engine = Engine(compiled_lm, artifact_tokenizer, prefix_caching=PrefixCaching(memory_mib=0))
    prompts = [[random.Random(100 + i).randrange(3, 380) for _ in range(60)] for i in range(4)]
    first = [engine.generate(request(p, 4)).token_ids for p in prompts]
    hits = counters(engine)[1]
    outputs = []
    engine.submit(request(prompts[0], 4), outputs.append)
    while engine.step():
        pass
    assert counters(engine)[1] == hits + 59 and outputs[0].num_cached_tokens == 59
    assert [t for out in outputs for t in out.token_ids] == first[0]


def test_a_stream_gets_a_token_every_step_while_a_long_prompt_is_prefilled(compiled_lm, artifact_tokenizer):
    """A 120-token prompt arrives while a stream decodes, with a step budget of 16 tokens: it is prefilled 15 tokens
    a step (8 steps), the stream gets one token in every one of them, no step runs more than 16 token positions,
    and both get the tokens they get alone."""
    counted = CountingModel(compiled_lm)
    engine = Engine(counted, artifact_tokenizer, limits=EngineLimits(max_num_batched_tokens=16), prefix_caching=OFF)
    stream, long = request(list(range(3, 13)), 60), request([random.Random(5).randrange(3, 380) for _ in range(120)], 4)
    alone = [_alone(compiled_lm, artifact_tokenizer, r.prompt_ids, r.max_tokens) for r in (stream, long)]
    tokens: dict[str, list[int]] = {stream.request_id: [], long.request_id: []}

    def sink(out):
        tokens[out.request_id].extend(out.token_ids)

    engine.submit(stream, sink)
    engine.step()
    engine.step()
    engine.submit(long, sink)
    steps = 0
    while not tokens[long.request_id]:
        before, counted.positions = len(tokens[stream.request_id]), 0
        engine.step()
        steps += 1
        assert len(tokens[stream.request_id]) == before + 1 and counted.positions <= 16
    assert steps == 8  # 120 tokens, 15 a step
    while engine.step():
        pass
    assert [tokens[r.request_id] for r in (stream, long)] == alone


def test_cache_off_reuses_nothing(compiled_lm, artifact_tokenizer):
    plain = Engine(compiled_lm, artifact_tokenizer, prefix_caching=OFF)
    plain.generate(request([*PREFIX, 1]))
    plain.generate(request([*PREFIX, 2]))
    assert counters(plain) == (0, 0) and not plain.scheduler.prefix_caching
    assert "turned off" in plain.prefix_caching_off_reason


@pytest.mark.parametrize("length", [65, 100, 127])
def test_a_prompt_longer_than_the_largest_bucket_is_prefilled_in_chunks(compiled_lm, artifact_tokenizer, tiny_llama,
                                                                       length):
    prompt = [random.Random(length).randrange(3, 380) for _ in range(length)]
    max_tokens = min(8, 128 - length)
    expected = hf_greedy(tiny_llama, prompt, max_tokens)
    plain = Engine(compiled_lm, artifact_tokenizer, prefix_caching=OFF)
    assert plain.generate(request(prompt, max_tokens)).token_ids == expected
    cached = Engine(compiled_lm, artifact_tokenizer)
    assert cached.generate(request(prompt[:40] + [7], max_tokens)).token_ids == hf_greedy(tiny_llama,
                                                                                          prompt[:40] + [7], max_tokens)
    assert cached.generate(request(prompt, max_tokens)).token_ids == expected  # 40 cached, the rest chunked
    assert counters(cached)[1] == 40


@pytest.mark.parametrize("tail", [[4, 5], list(range(200, 260))], ids=["42 tokens", "100 tokens: chunked"])
def test_prompt_logprobs_of_cached_positions_are_computed(compiled_lm, artifact_tokenizer, tiny_llama, tail):
    import torch

    prompt = [*PREFIX, *tail]
    cached = Engine(compiled_lm, artifact_tokenizer)
    cached.generate(request(prompt))
    outputs = []
    cached.submit(request(prompt, prompt_logprobs=0), outputs.append)
    while cached.step():
        pass
    assert counters(cached) == (len(prompt), 0)  # not looked up: every position's logits are needed
    reference = torch.log_softmax(hf_logits(tiny_llama, prompt), -1)
    got = outputs[0].prompt_logprobs
    assert got[0] is None
    for i, entry in enumerate(got[1:], start=1):
        assert entry.logprob == pytest.approx(float(reference[i - 1, prompt[i]]), abs=1e-4)


def test_only_rows_that_hold_a_prompts_kv_are_cached(compiled_lm, artifact_tokenizer, tiny_llama):
    """A scoring-only request with n = 2 prefills its leader's row and copies nothing to the other: only the
    leader's row is kept (a failed request keeps nothing either: test_prefix_cache.py)."""
    cached = Engine(compiled_lm, artifact_tokenizer)
    members = [request(PREFIX, 0, prompt_logprobs=0) for _ in range(2)]
    cached.submit_forks(members, [lambda out: None] * 2)
    while cached.step():
        pass
    assert list(cached.scheduler.rows.cached_rows().values()) == [len(PREFIX)]
    follow = [*PREFIX, 5]
    assert cached.generate(request(follow)).token_ids == hf_greedy(tiny_llama, follow, 12)
    assert counters(cached)[1] == len(PREFIX)


def test_parallel_samples_and_structured_outputs_from_a_cached_prefix(compiled_lm, artifact_tokenizer):
    seeded = [SamplingParams(temperature=1.0, top_p=0.9, seed=s) for s in (1, 2, 3)]
    prompt = [*PREFIX, 3, 1, 4]

    def run(engine):
        engine.generate(request([*PREFIX, 2, 7]))  # leaves PREFIX in a free row
        members = [request(prompt, 10, sampling=p) for p in seeded]
        outputs = {m.request_id: [] for m in members}
        engine.submit_forks(members, [lambda out, rid=m.request_id: outputs[rid].extend(out.token_ids)
                                      for m in members])
        while engine.step():
            pass
        grammar = engine.grammars.compile(GrammarSpec("regex", "(yes|no|maybe)", "guided_regex"))
        structured = engine.generate(request([*PREFIX, 8], 8, grammar=grammar))
        return [outputs[m.request_id] for m in members], structured.text

    expected = run(Engine(compiled_lm, artifact_tokenizer, prefix_caching=OFF))
    cached = Engine(compiled_lm, artifact_tokenizer)
    assert run(cached) == expected
    assert expected[1] in ("yes", "no", "maybe")
    assert counters(cached)[1] >= 2 * 40


def test_prompt_lookup_speculation_with_cached_prefixes(spec_lm, spec_tokenizer):
    texts = [[*PREFIX, *tail] for tail in ([1, 2, 1, 2], [1, 2, 3], [5], [1, 2, 1, 2, 9], [PREFIX[0]] * 6)]
    requests = [request(t, 16 + i) for i, t in enumerate(texts)]
    expected = run_all(Engine(spec_lm, spec_tokenizer, prefix_caching=OFF), requests)
    cached = Engine(spec_lm, spec_tokenizer)
    first = run_all(cached, requests[:1])
    assert run_all(cached, requests[1:]) | first == expected
    # the first takes PREFIX's row in place (40 tokens); the others, admitted with it, find its 2 full blocks in
    # the pool, where the row's prefix went as it was taken
    assert counters(cached)[1] >= 40 + 3 * 32


def test_lora_adapters_never_share_cached_kv(lora_artifact):
    from neuronpack.backends.torch_aot import load_artifact
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    artifact = lora_artifact[0]
    model, tok = load_artifact(artifact), ArtifactTokenizer.from_dir(artifact)
    adapters = [0, 1, 2, 1, 0, 2]
    reqs = [request([*PREFIX, 6 + i % 2], adapter=a) for i, a in enumerate(adapters)]
    expected = [Engine(model, tok, prefix_caching=OFF).generate(r).token_ids for r in reqs]
    cached = Engine(model, tok)
    assert [cached.generate(r).token_ids for r in reqs] == expected
    # the first request of each adapter finds nothing; the second of each finds its own adapter's 40 tokens
    assert counters(cached)[1] == 3 * 40


# -- random request sets --------------------------------------------------------------------------------------------
_REFERENCE: dict[tuple, list[int]] = {}


def _alone(compiled_lm, artifact_tokenizer, prompt: tuple[int, ...], max_tokens: int) -> list[int]:
    key = (prompt, max_tokens)
    if key not in _REFERENCE:
        engine = Engine(compiled_lm, artifact_tokenizer, prefix_caching=OFF)
        _REFERENCE[key] = engine.generate(request(prompt, max_tokens)).token_ids
    return _REFERENCE[key]


STEMS = [PREFIX, PREFIX[:20], [7] * 18 + PREFIX[:10], list(range(100, 133))]
request_sets = st.lists(
    st.tuples(st.sampled_from(range(len(STEMS))), st.integers(8, 40), st.lists(st.integers(3, 380), max_size=30),
              st.integers(1, 10), st.booleans(), st.integers(0, 3), st.integers(1, 2)),
    min_size=1, max_size=8)


class CountingModel:
    """The compiled model, counting the token positions each call runs (prefill calls: prompts x the longest chunk;
    decode: one per row): what an engine step costs, checked against its token budget."""

    def __init__(self, model) -> None:
        self.__dict__.update(_model=model, positions=0)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def prefill(self, slots, prompts, adapters=None, starts=None):
        self.positions += len(prompts) * max(len(p) for p in prompts)
        return self._model.prefill(slots, prompts, adapters, starts)

    def decode(self, tokens, positions, slots=None, adapters=None):
        self.positions += len(tokens)
        return self._model.decode(tokens, positions, slots, adapters)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request_sets, st.sampled_from([0, 1, 3, 8]), st.sampled_from([6, 24, 64]))
def test_random_arrivals_and_budgets_never_change_a_token_nor_pass_a_budget(compiled_lm, artifact_tokenizer, specs,
                                                                           pool_blocks, step_tokens):
    """Prompts cut from a few shared stems (up to 100 tokens: chunked), with their own tails, arriving over several
    steps, some with n = 2, some aborted mid stream; a prefix pool of 0, 1, 3 or 8 blocks (constant evictions) and
    a step budget of 6, 24 or 64 tokens. Every request's tokens are those it gets alone without the cache (an
    aborted one's a prefix of them); every step runs at most its budget of token positions while streams decode
    (one chunk of the largest bucket when none does), the pool's bytes never pass its budget, and afterwards no
    row is held (150 examples, run once by hand, passed too)."""
    block = 16 * compiled_lm.kv_token_bytes
    counted = CountingModel(compiled_lm)
    engine = Engine(counted, artifact_tokenizer, prefix_caching=PrefixCaching(memory_mib=pool_blocks * block / 2**20),
                    limits=EngineLimits(max_num_batched_tokens=step_tokens))
    assert engine.scheduler.rows.cache_blocks == pool_blocks
    arrivals = sorted(((delay, abort, [request(tuple(STEMS[stem][: max(1, cut)] + tail)[:100], max_tokens)
                                       for _ in range(n)])
                       for stem, cut, tail, max_tokens, abort, delay, n in specs), key=lambda a: a[0])
    outputs: dict[str, list[int]] = {}
    finished: dict[str, str] = {}
    submitted: dict[str, GenerationRequest] = {}

    def sink_for(rid):
        def sink(out):
            outputs[rid].extend(out.token_ids)
            if out.finish_reason is not None:
                finished[rid] = out.finish_reason
        return sink

    def step():
        decoding, counted.positions = bool(engine.scheduler.decoding), 0
        engine.step()
        assert counted.positions <= (step_tokens if decoding else max(step_tokens, 64))
        text = engine.metrics.render().decode()
        assert metric_value(text, "neuronpack_prefix_cache_usage_bytes") <= pool_blocks * block

    steps = 0
    while arrivals or not engine.scheduler.idle:
        while arrivals and arrivals[0][0] <= steps:
            _, abort, members = arrivals.pop(0)
            for req in members:
                outputs[req.request_id], submitted[req.request_id] = [], req
            engine.submit_forks(members, [sink_for(req.request_id) for req in members])
            if abort:  # ends mid prefill, after it, or in its first decode steps, whichever the queue allows
                step()
                engine.abort(members[0].request_id)
                engine._drain_inbox()  # the abort lands now: the next step's budget is known before it
        step()
        steps += 1
    assert engine.scheduler.idle and engine.scheduler.free_rows == 4 and not engine.scheduler.running
    assert not engine.scheduler.prefilling and not engine.runner._pieces
    for rid, req in submitted.items():
        alone = _alone(compiled_lm, artifact_tokenizer, req.prompt_ids, req.max_tokens)
        assert finished[rid] in ("length", "abort")
        if finished[rid] == "length":
            assert outputs[rid] == alone
        else:
            assert outputs[rid] == alone[: len(outputs[rid])]


def test_every_output_says_how_many_prompt_tokens_were_cached(cached):
    """StepOutput.num_cached_tokens (what usage.prompt_tokens_details.cached_tokens and the request log report) is
    the prefix cache's hits for that prompt; the forks of a parallel sample copy the whole prompt from the first."""
    a, b = [*PREFIX, 5, 6, 7], [*PREFIX, 9, 10]
    for prompt, expected in ((a, 0), (b, 40), (b, len(b) - 1)):
        hits, outputs = counters(cached)[1], []
        cached.submit(request(prompt, 3), outputs.append)
        while cached.step():
            pass
        assert counters(cached)[1] - hits == expected
        assert [o.num_cached_tokens for o in outputs] == [expected] * 3
    members = [request(a, 2, sampling=SamplingParams(temperature=1.0, seed=s)) for s in (1, 2)]
    outputs = {m.request_id: [] for m in members}
    hits = counters(cached)[1]
    cached.submit_forks(members, [outputs[m.request_id].append for m in members])
    while cached.step():
        pass
    leader_hits = counters(cached)[1] - hits
    assert leader_hits > 0  # a's prefix is still cached (in its row or the block pool)
    assert [{o.num_cached_tokens for o in outputs[m.request_id]} for m in members] == [{leader_hits}, {len(a)}]
