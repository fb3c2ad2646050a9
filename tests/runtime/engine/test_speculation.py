"""Speculative decoding's pure parts: prompt-lookup drafts (vLLM's ngram semantics), greedy acceptance, rejection
sampling (statistically: the emitted tokens follow the target's distribution), and the counts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from neuronpack.runtime.engine.sampling import RowSampler, SamplingParams, filtered_distribution, sample
from neuronpack.runtime.engine.speculation.acceptance import accept
from neuronpack.runtime.engine.speculation.proposer import Draft, DraftRequest, PromptLookupProposer, lookup_draft
from neuronpack.runtime.engine.speculation.stats import SpecStats
from tests.fuzz import fuzz_settings


def reference_lookup(ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Brute force: the longest n in [min_n, max_n] whose suffix n-gram occurs earlier (not as the suffix itself),
    its earliest occurrence, the k tokens after it."""
    for n in range(max_n, min_n - 1, -1):
        if n >= len(ids):
            continue
        suffix = ids[len(ids) - n:]
        for i in range(len(ids) - n):
            if ids[i:i + n] == suffix:
                return ids[i + n:i + n + k]
    return []


def test_lookup_follows_vllm_examples():
    assert lookup_draft([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]  # vLLM's docstring example
    assert lookup_draft([1, 2, 3, 4, 2, 3], 2, 3, 1) == [4]
    assert lookup_draft([5, 6, 7, 5, 6, 8, 5, 6], 2, 2, 3) == [7, 5, 6]  # the earliest occurrence wins
    assert lookup_draft([9, 5, 6, 1, 7, 5, 6, 2, 5, 6], 1, 3, 2) == [1, 7]
    assert lookup_draft([1, 2, 3, 9, 2, 3, 4, 7, 3, 4], 1, 2, 2) == [7, 3]  # the longer [3, 4] beats [4]
    assert lookup_draft([4, 4, 4, 4], 2, 2, 3) == [4, 4]  # the match may overlap the suffix
    assert lookup_draft([1, 2, 3], 1, 5, 4) == []  # no repeat
    assert lookup_draft([1, 2, 1], 2, 2, 4) == []  # only a 1-gram repeats
    assert lookup_draft([1, 2, 1], 1, 2, 0) == []  # no room
    assert lookup_draft([7], 1, 1, 3) == []


@fuzz_settings(200)
@given(ids=st.lists(st.integers(0, 3), max_size=40), sizes=st.tuples(st.integers(1, 4), st.integers(0, 3)),
       k=st.integers(0, 6))
def test_lookup_matches_brute_force(ids, sizes, k):
    min_n, max_n = sizes[0], sizes[0] + sizes[1]
    assert lookup_draft(ids, min_n, max_n, k) == reference_lookup(ids, min_n, max_n, k)


def test_proposer_caps_each_request():
    proposer = PromptLookupProposer(min_n=1, max_n=2)
    drafts = proposer.propose([DraftRequest("a", [1, 2, 3, 1, 2], 2), DraftRequest("b", [1, 2, 3], 4),
                               DraftRequest("c", [1, 2, 1, 2], 0)])
    assert [d.token_ids for d in drafts] == [[3, 1], [], []]
    assert all(d.probs is None for d in drafts)
    with pytest.raises(ValueError):
        PromptLookupProposer(min_n=3, max_n=2)


def row(**params) -> RowSampler:
    return RowSampler(SamplingParams(**params).resolve(256))


def test_greedy_keeps_the_agreeing_prefix_then_the_targets_token():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 50)
    best = logits.argmax(-1).tolist()  # [3, 5]
    drafts = [Draft(best[0][:4]), Draft([best[1][0], (best[1][1] + 1) % 50, 3]), Draft([])]
    out = accept(logits, drafts, [row(temperature=0), row(temperature=0), row(temperature=0)])
    assert out[0].token_ids == best[0] and (out[0].num_draft, out[0].num_accepted) == (4, 4)  # all + bonus
    assert out[1].token_ids == best[1][:2] and (out[1].num_draft, out[1].num_accepted) == (3, 1)
    assert out[2].token_ids == [best[2][0]] and (out[2].num_draft, out[2].num_accepted) == (0, 0)


def test_greedy_logprobs_per_emitted_token():
    torch.manual_seed(1)
    logits = torch.randn(1, 3, 20)
    best = logits[0].argmax(-1).tolist()
    out = accept(logits, [Draft(best[:2])], [row(temperature=0, logprobs=2)])[0]
    assert out.token_ids == best and len(out.logprobs) == 3
    logp = torch.log_softmax(logits[0], -1)
    for j, entry in enumerate(out.logprobs):
        assert entry.token_id == best[j] and entry.logprob == pytest.approx(float(logp[j, best[j]]))
        assert entry.top[0][0] == best[j] and len(entry.top) == 2


def test_rows_without_drafts_sample_like_plain_decoding():
    """A seeded request with no draft uses its random stream exactly as a plain decode step does."""
    torch.manual_seed(2)
    logits = torch.randn(2, 4, 100)
    plain_rows = [row(temperature=0.8, seed=5), row(temperature=1.2, top_k=20, seed=6)]
    spec_rows = [row(temperature=0.8, seed=5), row(temperature=1.2, top_k=20, seed=6)]
    for _ in range(20):
        expected = sample(logits[:, 0], plain_rows)[0].tolist()
        got = [a.token_ids[0] for a in accept(logits, [Draft([]), Draft([])], spec_rows)]
        assert got == expected


def test_shapes_are_checked():
    logits = torch.zeros(1, 2, 10)
    with pytest.raises(ValueError, match="longer than"):
        accept(logits, [Draft([1, 2])], [row(temperature=0)])
    with pytest.raises(ValueError, match="logit rows"):
        accept(logits, [], [])


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The request's sampling distribution at each position, over the full vocabulary: [T, vocab]."""
    probs, ids = filtered_distribution(logits, [params] * logits.shape[0])
    probs = probs / probs.sum(-1, keepdim=True)
    return torch.zeros(logits.shape).scatter_(1, ids, probs)


def total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return float((counts / counts.sum() - probs).abs().sum() / 2)


def emitted_distribution(logits, draft: Draft, params: SamplingParams, trials: int, seed: int):
    """Counts of the first emitted token, and of the second one when the first draft was kept."""
    vocab = logits.shape[-1]
    sampler = RowSampler(SamplingParams(**{**params.__dict__, "seed": seed}))
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    for _ in range(trials):
        out = accept(logits[None], [draft], [sampler])[0]
        first[out.token_ids[0]] += 1
        if out.num_accepted >= 1:
            second[out.token_ids[1]] += 1
    return first, second


@fuzz_settings(6)
@given(seed=st.integers(0, 2**16), temperature=st.floats(0.4, 1.6), top_k=st.sampled_from([-1, 2, 3, 5]),
       top_p=st.sampled_from([1.0, 0.9, 0.6]), draft=st.lists(st.integers(0, 5), min_size=1, max_size=3))
def test_rejection_sampling_emits_the_targets_distribution(seed, temperature, top_k, top_p, draft):
    """Whatever the (one-hot) draft, the first emitted token is distributed as the target's sampling distribution,
    and, given the first draft was kept, so is the second (the verify logits there assume that prefix)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(draft) + 1, 6, generator=gen) * 1.5
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p).resolve(256)
    p = target_probs(logits, params)
    first, second = emitted_distribution(logits, Draft(draft), params, trials=3000, seed=seed)
    assert total_variation(first, p[0]) < 0.05
    assert first[draft[0]] / 3000 == pytest.approx(float(p[0, draft[0]]), abs=0.04)  # kept with probability p(d)
    if len(draft) > 1 and second.sum() >= 1000:
        assert total_variation(second, p[1]) < 0.07


def test_rejection_sampling_with_draft_distributions():
    """EAGLE-style drafts come with their distribution q: the draft token is drawn from q, kept with probability
    min(1, p/q), else replaced from norm(max(0, p - q)); the emitted token still follows p."""
    gen = torch.Generator().manual_seed(3)
    vocab, trials = 5, 4000
    logits = torch.randn(2, vocab, generator=gen)
    q = torch.softmax(torch.randn(vocab, generator=gen) * 2, -1)
    params = SamplingParams(temperature=1.0).resolve(256)
    sampler = RowSampler(SamplingParams(temperature=1.0, seed=11).resolve(256))
    counts = torch.zeros(vocab)
    for _ in range(trials):
        d = int(torch.multinomial(q, 1, generator=gen))
        out = accept(logits[None], [Draft([d], probs=q[None])], [sampler])[0]
        counts[out.token_ids[0]] += 1
    assert total_variation(counts, target_probs(logits, params)[0]) < 0.04


def test_stats_follow_vllm_definitions():
    stats = SpecStats.new(length=3)
    stats.observe(3, 3)
    stats.observe(2, 0)
    stats.observe(0, 0)  # no guess this step: not a draft
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (2, 5, 3)
    assert stats.num_accepted_tokens_per_pos == [1, 1, 1]
    assert stats.acceptance_rate == pytest.approx(0.6) and stats.mean_acceptance_length == pytest.approx(2.5)
    assert stats.steps == 3 and stats.tokens_per_step == pytest.approx((4 + 1 + 1) / 3)
    assert SpecStats.new(2).to_dict()["acceptance_rate"] is None
    with pytest.raises(ValueError):
        stats.observe(4, 1)
