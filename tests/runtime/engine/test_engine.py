"""The engine on a real compiled artifact: greedy equals transformers, continuous batching, limits, aborts."""

import pytest

from neuronpack.errors import InvalidRequestError, ServeError
from neuronpack.runtime.engine import Engine, GenerationRequest
from neuronpack.runtime.engine.requests import EngineLimits
from neuronpack.runtime.engine.sampling import SamplingParams
from tests.runtime.serving import hf_greedy

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ["The quick brown fox", "Hello world! How are", "A recipe describes a build: model, target, buckets"]


@pytest.fixture
def engine(compiled_lm, artifact_tokenizer):
    return Engine(compiled_lm, artifact_tokenizer)


def greedy_request(tok, text, max_tokens=24, **kwargs):
    return GenerationRequest(prompt_ids=tuple(tok.encode(text)), sampling=GREEDY, max_tokens=max_tokens, **kwargs)


@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_matches_transformers(engine, tiny_llama, text):
    request = greedy_request(engine.tokenizer, text)
    result = engine.generate(request)
    expected = hf_greedy(tiny_llama, list(request.prompt_ids), 24)
    assert result.token_ids == expected
    assert result.prompt_tokens == len(request.prompt_ids) and result.completion_tokens == len(expected)
    assert result.finish_reason == ("stop" if expected[-1] == engine.tokenizer.eos_token_id else "length")


def test_continuous_batching_queues_interleaves_and_matches_sequential(engine):
    tok = engine.tokenizer
    texts = [f"{p} {i}" for i, p in enumerate(PROMPTS * 2)]  # 6 requests for 4 slots
    sequential = {t: engine.generate(greedy_request(tok, t, max_tokens=12 + i)).token_ids for i, t in enumerate(texts)}
    outputs: dict[str, list[int]] = {t: [] for t in texts}

    def sink_for(text):
        return lambda out: outputs[text].extend(out.token_ids)

    for i, text in enumerate(texts[:4]):
        engine.submit(greedy_request(tok, text, max_tokens=12 + i), sink_for(text))
    engine.step()  # idle engine: every free slot is filled at once, then one decode step
    assert len(engine.scheduler.running) == 4 and not engine.scheduler.waiting
    for i, text in enumerate(texts[4:], start=4):
        engine.submit(greedy_request(tok, text, max_tokens=12 + i), sink_for(text))
    engine.step()
    assert len(engine.scheduler.waiting) == 2  # slots full: the new requests queue
    steps = 0
    while engine.step():
        steps += 1
    assert outputs == sequential
    assert engine.scheduler.idle and steps > 0


@pytest.mark.parametrize(("budget", "admitted"), [(64, 3), (6, 1)])
def test_a_burst_during_a_stream_shares_one_prefill_within_the_token_budget(compiled_lm, artifact_tokenizer, budget,
                                                                             admitted):
    """Three prompts arriving while a stream decodes: a step budget of 64 tokens admits all three in one
    step, their chunks sharing one call beside the decode step; a budget of 6 tokens leaves 5 for prompts, so one
    prompt's chunks go at a time. Either way every sequence's tokens are what it generates alone."""
    engine = Engine(compiled_lm, artifact_tokenizer, limits=EngineLimits(max_num_batched_tokens=budget))
    tok = engine.tokenizer
    texts = [f"{p} {i}" for i, p in enumerate(PROMPTS + PROMPTS[:1])]
    alone = {t: engine.generate(greedy_request(tok, t, max_tokens=8)).token_ids for t in texts}
    outputs: dict[str, list[int]] = {t: [] for t in texts}
    engine.submit(greedy_request(tok, texts[0], max_tokens=8), lambda out: outputs[texts[0]].extend(out.token_ids))
    engine.step()
    for text in texts[1:]:
        engine.submit(greedy_request(tok, text, max_tokens=8), lambda out, t=text: outputs[t].extend(out.token_ids))
    engine.step()
    assert len(engine.scheduler.running) == 1 + admitted
    while engine.step():
        pass
    assert outputs == alone


def test_a_step_budget_a_full_batch_would_use_up_is_refused(compiled_lm, artifact_tokenizer):
    with pytest.raises(ServeError, match="leaves no token for prompts") as refused:
        Engine(compiled_lm, artifact_tokenizer, limits=EngineLimits(max_num_batched_tokens=4))
    assert refused.value.where == "--max-num-batched-tokens" and "more than 4" in refused.value.fix


def test_seeded_sampling_is_reproducible(engine):
    tok = engine.tokenizer
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=1234)
    request = GenerationRequest(prompt_ids=tuple(tok.encode("Hello")), sampling=params, max_tokens=16,
                                ignore_eos=True)
    first = engine.generate(request).token_ids
    assert engine.generate(request).token_ids == first
    other = GenerationRequest(prompt_ids=request.prompt_ids, sampling=SamplingParams(temperature=1.0, seed=99),
                              max_tokens=16, ignore_eos=True)
    assert engine.generate(other).token_ids != first


def test_limits_are_checked_up_front(engine):
    # A prompt longer than the largest context bucket (64) is prefilled in chunks: up to max_model_len - 1 tokens.
    assert engine.max_prompt_len == 127 and engine.max_model_len == 128
    assert engine.check(GenerationRequest(prompt_ids=(5,) * 127)) == 1
    with pytest.raises(InvalidRequestError, match="128 tokens, leaving no room to generate") as exc:
        engine.check(GenerationRequest(prompt_ids=(5,) * 128))
    assert exc.value.param == "prompt" and "128" in str(exc.value)
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.check(GenerationRequest(prompt_ids=()))
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        engine.check(GenerationRequest(prompt_ids=(5, 10_000)))
    with pytest.raises(InvalidRequestError, match="temperature"):
        engine.check(GenerationRequest(prompt_ids=(5,), sampling=SamplingParams(temperature=-1)))
    # max_tokens is clamped to what fits the model length (prompt 60 + 68 = 128); omitted means "fill it".
    assert engine.check(GenerationRequest(prompt_ids=(5,) * 60, max_tokens=100)) == 68
    assert engine.check(GenerationRequest(prompt_ids=(5,) * 60)) == 68
    result = engine.generate(GenerationRequest(prompt_ids=(5,) * 60, sampling=GREEDY, max_tokens=100,
                                               ignore_eos=True))
    assert result.finish_reason == "length" and result.prompt_tokens + result.completion_tokens == 128


def test_lookahead_finishes_one_iteration_early(compiled_lm, artifact_tokenizer):
    prompt = tuple(range(5, 65))  # 60 tokens
    plain = Engine(compiled_lm, artifact_tokenizer, max_model_len=70)
    speculative = Engine(compiled_lm, artifact_tokenizer, max_model_len=70, lookahead=3)
    request = GenerationRequest(prompt_ids=prompt, sampling=GREEDY, ignore_eos=True)
    a, b = plain.generate(request), speculative.generate(request)
    assert (a.finish_reason, a.completion_tokens) == ("length", 10)  # stops at L = 70
    assert (b.finish_reason, b.completion_tokens) == ("length", 8)  # stops at L = 68: 68 + 3 > 70
    assert b.token_ids == a.token_ids[:8]


def test_abort_frees_the_slot_at_once(engine):
    tok = engine.tokenizer
    seen = []
    request_id = engine.submit(greedy_request(tok, "Hello", max_tokens=100, ignore_eos=True), seen.append)
    engine.step()
    engine.step()
    assert len(engine.scheduler.running) == 1
    engine.abort(request_id)
    engine.step()
    assert engine.scheduler.idle
    # 2 tokens (its prefill's; its first decode step is the next step's), then abort
    assert seen[-1].finish_reason == "abort" and len(seen) == 3
    text = engine.metrics.render().decode()
    assert 'neuronpack_requests_total{finish_reason="abort"} 1.0' in text


def test_background_loop_serves_concurrent_generates(engine):
    import threading

    tok = engine.tokenizer
    expected = {t: engine.generate(greedy_request(tok, t, 10)).token_ids for t in PROMPTS}
    engine.start()
    try:
        results = {}
        threads = [threading.Thread(target=lambda t=t: results.__setitem__(t, engine.generate(
            greedy_request(tok, t, 10)).token_ids)) for t in PROMPTS]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
    finally:
        engine.shutdown()
    assert results == expected


def test_the_background_loop_sets_its_own_torch_threads(compiled_lm, artifact_tokenizer):
    """``loop_threads`` is set on the loop's own thread (serve loads on one thread, so that only the loop opens
    OpenMP teams: a second team's workers made every parallel region wake sleeping threads, 3x slower decode)."""
    import threading

    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = Engine(compiled_lm, artifact_tokenizer)
    engine.loop_threads = 2
    seen: list[tuple[str, int]] = []
    done = threading.Event()

    def sink(out):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        if out.finish_reason is not None:
            done.set()

    engine.start()
    try:
        engine.submit(greedy_request(engine.tokenizer, PROMPTS[0], max_tokens=3), sink)
        assert done.wait(60)
    finally:
        engine.shutdown()
        torch.set_num_threads(before)
    assert seen and all(name == "neuronpack-engine" and threads == 2 for name, threads in seen)


def test_decode_outputs_say_how_many_sequences_their_step_ran(engine):
    """StepOutput.batch (the request log's batch): three requests start together and end after 3, 5 and 7 tokens,
    so their decode steps ran 3, 3, then 2, 2, then 1, 1 sequences; a prefill's output has none."""
    batches: dict[int, list[int | None]] = {}
    for n in (3, 5, 7):
        engine.submit(greedy_request(engine.tokenizer, PROMPTS[0], max_tokens=n, ignore_eos=True),
                      lambda out, n=n: batches.setdefault(n, []).append(out.batch))
    while engine.step():
        pass
    assert batches == {3: [None, 3, 3], 5: [None, 3, 3, 2, 2], 7: [None, 3, 3, 2, 2, 1, 1]}
