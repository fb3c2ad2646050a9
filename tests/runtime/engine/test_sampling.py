"""Per-row sampling: on-device rules, greedy, top-k / top-p filtering, seeds, distribution."""

import pytest
import torch

from neuronpack.runtime.engine.sampling import RowSampler, SamplingParams, sample, sample_rows


def sampler(**kwargs) -> RowSampler:
    global_topk = kwargs.pop("global_topk", 256)
    return RowSampler(SamplingParams(**kwargs).resolve(global_topk))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (SamplingParams(temperature=0.0, top_k=50, top_p=0.5), (1.0, 1, 1.0)),  # greedy: (1, 1.0, 1.0)
        (SamplingParams(temperature=0.7, top_k=-1), (0.7, 256, 1.0)),  # no limit -> global_topk
        (SamplingParams(temperature=0.7, top_k=0), (0.7, 256, 1.0)),
        (SamplingParams(temperature=0.7, top_k=1000), (0.7, 256, 1.0)),  # above global_topk -> global_topk
        (SamplingParams(temperature=0.7, top_k=40, top_p=0.9), (0.7, 40, 0.9)),
    ],
)
def test_resolve_applies_dynamic_on_device_rules(given, expected):
    r = given.resolve(256)
    assert (r.temperature, r.top_k, r.top_p) == expected


def test_greedy_rows_take_the_argmax():
    torch.manual_seed(0)
    logits = torch.randn(5, 1000)
    out = sample_rows(logits, [sampler(temperature=0.0) for _ in range(5)])
    assert out.tolist() == logits.argmax(-1).tolist()


def test_seed_reproduces_and_rows_are_independent_of_the_batch():
    torch.manual_seed(1)
    logits = torch.randn(3, 500)

    def draw(seed, batch):
        s = sampler(temperature=1.0, seed=seed)
        rows = [sampler(temperature=0.0), s, sampler(temperature=1.3, seed=99)] if batch else [s]
        index = 1 if batch else 0
        picks = [sample_rows(logits[[0, 1, 2]] if batch else logits[1:2], rows)[index].item() for _ in range(50)]
        return picks

    alone = draw(7, batch=False)
    assert alone == draw(7, batch=False)
    assert alone == draw(7, batch=True)  # same seed, other rows around it: same tokens
    assert alone != draw(8, batch=False)


def test_seeded_row_ignores_other_rows_top_k_and_its_own_logprobs():
    torch.manual_seed(2)
    logits = torch.randn(2, 300)

    def draw(other_top_k, logprobs):
        s = sampler(temperature=0.9, top_k=8, seed=4, logprobs=logprobs)
        return [sample_rows(logits, [s, sampler(temperature=1.0, top_k=other_top_k)])[0].item() for _ in range(30)]

    assert draw(8, None) == draw(200, None) == draw(8, 20)


def test_logprobs_are_of_the_distribution_sampled_from():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    s = sampler(temperature=0.5, top_k=3, seed=0, logprobs=4)
    tokens, entries = sample(logits, [s])
    expected = torch.log_softmax(logits[0, :3] / 0.5, -1)
    entry = entries[0]
    assert entry.token_id == tokens[0].item() and entry.logprob == pytest.approx(expected[entry.token_id].item())
    assert [i for i, _ in entry.top] == [0, 1, 2, 3]
    assert [v for _, v in entry.top[:3]] == pytest.approx(expected.tolist()) and entry.top[3][1] == float("-inf")
    greedy = sampler(temperature=0.0, logprobs=2)
    _, (entry,) = sample(logits, [greedy])
    assert entry.logprob == pytest.approx(torch.log_softmax(logits[0], -1)[0].item())  # greedy: the model's own
    assert sample(logits, [sampler(temperature=0.5)])[1] == [None]


def test_top_k_and_global_topk_limit_the_candidates():
    logits = torch.linspace(0, 1, 100)[None, :]  # nearly flat: everything would be sampled without a limit
    s = sampler(temperature=1.0, top_k=3, seed=0)
    picks = {sample_rows(logits, [s]).item() for _ in range(300)}
    assert picks == {97, 98, 99}
    g = sampler(temperature=1.0, top_k=-1, seed=0, global_topk=2)  # "no limit" still stops at global_topk
    assert {sample_rows(logits, [g]).item() for _ in range(300)} == {98, 99}


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    s = sampler(temperature=1.0, top_p=0.6, seed=0)  # 0.5 < 0.6, 0.5 + 0.3 >= 0.6: keep tokens 0 and 1
    assert {sample_rows(logits, [s]).item() for _ in range(300)} == {0, 1}
    s = sampler(temperature=1.0, top_p=0.5, seed=0)
    assert {sample_rows(logits, [s]).item() for _ in range(100)} == {0}


def test_sampling_follows_the_tempered_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    temperature = 0.8
    s = sampler(temperature=temperature, seed=123)
    n = 6000
    counts = torch.bincount(torch.cat([sample_rows(logits, [s]) for _ in range(n)]), minlength=5).float()
    expected = torch.softmax(logits[0] / temperature, -1)
    # Each frequency within 4 standard deviations of its binomial expectation.
    sd = (expected * (1 - expected) / n).sqrt()
    assert ((counts / n - expected).abs() <= 4 * sd + 1e-3).all(), (counts / n, expected)


def test_row_count_must_match():
    with pytest.raises(ValueError, match="2 logit rows but 1 samplers"):
        sample_rows(torch.zeros(2, 4), [sampler()])


def test_degenerate_top_p_and_temperature_still_sample_the_best_token():
    """Regression (schemathesis: top_p 5e-324 gave a 500): top_p that rounds to 0 in float32 keeps the best token,
    and a temperature below 1e-5 is greedy instead of dividing the logits by a float32 zero."""
    import torch

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    samplers = [RowSampler(SamplingParams(temperature=1.0, top_p=5e-324).resolve()),
                RowSampler(SamplingParams(temperature=5e-324).resolve()),
                RowSampler(SamplingParams(temperature=1e-6, top_k=5).resolve())]
    assert sample_rows(logits, samplers).tolist() == logits.argmax(-1).tolist()
