"""OpenAI completeness over HTTP with the official client: logprobs, echo (prompt logprobs), n > 1 with one shared
prefill, chat logprobs, scoring-only requests, stop handling, per-request seeds, refused fields. Logprob values are
checked against transformers' logits for the same tokens."""

import asyncio
import math

import httpx
import openai
import pytest
import torch

from neuronpack.runtime.engine import Engine, GenerationRequest
from neuronpack.runtime.engine.sampling import SamplingParams
from tests.runtime.serving import engine_server, hf_greedy, hf_logits, metric_value

NAME = "tiny"
ATOL = 1e-4  # fp32 artifact vs fp32 transformers


@pytest.fixture(scope="module")
def server(compiled_lm, artifact_tokenizer):
    with engine_server(Engine(compiled_lm, artifact_tokenizer), served_model_name=NAME) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def engine_run(server, prompt_ids, max_tokens, **sampling):
    """The same request through the engine directly: its token ids and text (token texts do not round-trip)."""
    request = GenerationRequest(prompt_ids=tuple(prompt_ids), sampling=SamplingParams(**sampling),
                                max_tokens=max_tokens, ignore_eos=True)
    result = server.engine.generate(request)
    return result.token_ids, result.text


def test_greedy_logprobs_are_the_models_and_top_n_is_best_first(client, server, tiny_llama):
    tok = server.engine.tokenizer
    prompt_ids = tok.encode("The quick brown fox")
    out = client.completions.create(model=NAME, prompt=prompt_ids, max_tokens=6, temperature=0, logprobs=3,
                                    extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    ids = hf_greedy(tiny_llama, prompt_ids, 6)
    assert lp.tokens == [tok.token_text(i) for i in ids]
    reference = torch.log_softmax(hf_logits(tiny_llama, prompt_ids + ids), -1)[len(prompt_ids) - 1 : -1]
    for step, (token_id, token_lp, top) in enumerate(zip(ids, lp.token_logprobs, lp.top_logprobs, strict=True)):
        assert token_lp == pytest.approx(reference[step, token_id].item(), abs=ATOL)
        best = torch.topk(reference[step], 3)
        # Keys are token texts: tokens whose texts collide (byte pieces of this random model) share one key.
        assert set(top) == {tok.token_text(i) for i in best.indices.tolist()}
        assert all(any(abs(v - b) < ATOL for b in best.values.tolist()) for v in top.values())
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]


def test_sampled_logprobs_are_of_the_tempered_filtered_distribution(client, server, tiny_llama):
    tok = server.engine.tokenizer
    prompt_ids = tok.encode("Hello world!")
    out = client.completions.create(model=NAME, prompt=prompt_ids, max_tokens=5, temperature=0.7, seed=3,
                                    logprobs=8, extra_body={"top_k": 5, "ignore_eos": True})
    lp = out.choices[0].logprobs
    ids, text = engine_run(server, prompt_ids, 5, temperature=0.7, top_k=5, seed=3)
    assert text == out.choices[0].text and lp.tokens == [tok.token_text(i) for i in ids]
    logits = hf_logits(tiny_llama, prompt_ids + ids)[len(prompt_ids) - 1 : -1]
    for step, token_id in enumerate(ids):
        values, top_ids = torch.topk(logits[step], 5)
        sampled_from = dict(zip(top_ids.tolist(), torch.log_softmax(values / 0.7, -1).tolist(), strict=True))
        assert token_id in sampled_from  # top_k 5: nothing else can be drawn
        assert lp.token_logprobs[step] == pytest.approx(sampled_from[token_id], abs=ATOL)
        top = lp.top_logprobs[step]
        assert -9999.0 in top.values()  # 8 asked, 5 candidates: the others are -inf
        assert all(any(abs(v - c) < ATOL for c in sampled_from.values()) for v in top.values() if v > -9999.0)
        assert sum(math.exp(v) for v in sampled_from.values()) == pytest.approx(1.0, abs=1e-5)


def test_echo_scores_the_prompt_like_transformers(client, server, tiny_llama):
    tok = server.engine.tokenizer
    prompts = [tok.encode("The quick brown fox jumps over"), tok.encode("Hello world! How are you")]
    before = metric_value(httpx.get(f"{server.url}/metrics").text, "neuronpack_generation_tokens_total")
    scored = client.completions.create(model=NAME, prompt=prompts, max_tokens=0, echo=True, logprobs=1,
                                       temperature=0)
    assert metric_value(httpx.get(f"{server.url}/metrics").text, "neuronpack_generation_tokens_total") == before
    assert scored.usage.completion_tokens == 0 and scored.usage.prompt_tokens == sum(map(len, prompts))
    for choice, ids in zip(scored.choices, prompts, strict=True):
        assert choice.text == tok.decode(ids) and choice.finish_reason == "length"
        lp = choice.logprobs
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        reference = torch.log_softmax(hf_logits(tiny_llama, ids), -1)
        expected = [reference[i - 1, ids[i]].item() for i in range(1, len(ids))]
        assert lp.token_logprobs[1:] == pytest.approx(expected, abs=ATOL)
        assert lp.tokens == [tok.token_text(i) for i in ids]
    # lm-eval's request: echo + max_tokens 1 -> the prompt's entries, then the generated token's.
    one = client.completions.create(model=NAME, prompt=prompts[:1], max_tokens=1, echo=True, logprobs=1,
                                    temperature=0)
    lp = one.choices[0].logprobs
    assert len(lp.token_logprobs) == len(prompts[0]) + 1
    assert lp.token_logprobs[: len(prompts[0])] == scored.choices[0].logprobs.token_logprobs
    assert one.choices[0].text.startswith(scored.choices[0].text)


def test_echo_streams_the_prompt_first(client):
    kwargs = dict(model=NAME, prompt="Hello world!", max_tokens=4, echo=True, logprobs=2, temperature=0)
    full = client.completions.create(**kwargs).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(**kwargs, stream=True)]
    assert "".join(c.text for c in chunks) == full.text
    assert [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs] == full.logprobs.token_logprobs
    assert [t for c in chunks if c.logprobs for t in c.logprobs.tokens] == full.logprobs.tokens
    assert chunks[-1].finish_reason == full.finish_reason


def test_n_choices_share_one_prefill_and_follow_seed_plus_index(client, server):
    kwargs = dict(model=NAME, prompt="A recipe describes", max_tokens=12, temperature=1.0,
                  extra_body={"ignore_eos": True})
    text = httpx.get(f"{server.url}/metrics").text
    prompt_before = metric_value(text, "neuronpack_prompt_tokens_total")
    out = client.completions.create(**kwargs, n=3, seed=11)
    prompt_len = out.usage.prompt_tokens
    after = metric_value(httpx.get(f"{server.url}/metrics").text, "neuronpack_prompt_tokens_total")
    assert after - prompt_before == prompt_len  # prefilled once, not three times
    assert [c.index for c in out.choices] == [0, 1, 2] and out.usage.completion_tokens == 36
    texts = [c.text for c in out.choices]
    assert len(set(texts)) == 3
    # Choice i is what a single request with seed + i gives (the forked KV is the prompt's).
    assert [client.completions.create(**kwargs, seed=11 + i).choices[0].text for i in range(3)] == texts
    # n larger than the batch (4 slots): prefilled in groups, every choice still there.
    kwargs["prompt"] = ["Hello", "The quick"]
    many = client.completions.create(**kwargs, n=6, seed=11)
    assert [c.index for c in many.choices] == list(range(12))
    kwargs["prompt"] = "The quick"
    assert [c.text for c in many.choices[6:12]] == [
        client.completions.create(**kwargs, seed=11 + i).choices[0].text for i in range(6)]


def test_chat_logprobs_and_n(client, server, tiny_llama):
    tok = server.engine.tokenizer
    messages = [{"role": "user", "content": "The quick brown fox?"}]
    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=5, temperature=0, logprobs=True,
                                         top_logprobs=2, n=2, extra_body={"ignore_eos": True})
    assert out.choices[0].message.content == out.choices[1].message.content  # greedy twice
    content = out.choices[0].logprobs.content
    prompt_ids = tok.encode_chat(messages)
    ids = hf_greedy(tiny_llama, prompt_ids, 5)
    assert [c.token for c in content] == [tok.token_text(i) for i in ids]
    reference = torch.log_softmax(hf_logits(tiny_llama, prompt_ids + ids), -1)[len(prompt_ids) - 1 : -1]
    for step, item in enumerate(content):
        assert item.logprob == pytest.approx(reference[step, ids[step]].item(), abs=ATOL)
        assert item.bytes == list(item.token.encode())
        assert [t.logprob for t in item.top_logprobs] == pytest.approx(torch.topk(reference[step], 2).values.tolist(),
                                                                       abs=ATOL)
    plain = client.chat.completions.create(model=NAME, messages=messages, max_tokens=3, temperature=0)
    assert plain.choices[0].logprobs is None
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=3, temperature=0,
                                                 logprobs=True, n=2, stream=True))
    assert {c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"} == {0, 1}
    streamed = [lp for c in chunks if c.choices[0].index == 0 and c.choices[0].logprobs
                for lp in c.choices[0].logprobs.content]
    # the same prompt again: its prefix is cached, the last position computed on its own (float32 rounding: ~1e-6)
    assert [s.logprob for s in streamed] == pytest.approx([c.logprob for c in content[:3]], abs=1e-5)


def test_stop_strings_tokens_and_include_stop_str_in_output(client, server):
    tok = server.engine.tokenizer
    base = client.completions.create(model=NAME, prompt="The quick", max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base[5:7]
    cut = base.index(stop)
    kept = client.completions.create(model=NAME, prompt="The quick", max_tokens=24, temperature=0, stop=[stop],
                                     extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert kept.choices[0].text == base[: cut + len(stop)] and kept.choices[0].finish_reason == "stop"
    assert kept.model_extra is not None and kept.choices[0].model_extra["stop_reason"] == stop
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=NAME, prompt="The quick", max_tokens=24, temperature=0, stop=[stop], stream=True,
        extra_body={"ignore_eos": True, "include_stop_str_in_output": True}))
    assert streamed == base[: cut + len(stop)]
    # A stop token: finish "stop", stop_reason is its id; with include_stop_str_in_output its text stays.
    ids, _ = engine_run(server, tok.encode("The quick"), 3, temperature=0)
    third = ids[2]
    texts = [engine_run(server, tok.encode("The quick"), n, temperature=0)[1] for n in (2, 3)]
    for include, expected in ((False, texts[0]), (True, texts[1])):
        out = client.completions.create(model=NAME, prompt="The quick", max_tokens=24, temperature=0,
                                        extra_body={"ignore_eos": True, "stop_token_ids": [third],
                                                    "include_stop_str_in_output": include}).choices[0]
        assert (out.text, out.finish_reason, out.model_extra["stop_reason"]) == (expected, "stop", third)


def test_seed_gives_the_same_text_whatever_shares_the_batch(server):
    body = dict(model=NAME, prompt="Hello", max_tokens=16, temperature=1.0, seed=5, ignore_eos=True)

    async def run(with_neighbours: bool) -> str:
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
        extra = {k: v for k, v in body.items() if k == "ignore_eos"}
        call = aclient.completions.create(**{k: v for k, v in body.items() if k != "ignore_eos"}, extra_body=extra)
        if not with_neighbours:
            return (await call).choices[0].text
        neighbours = [aclient.completions.create(model=NAME, prompt=p, max_tokens=20, temperature=1.3)
                      for p in ("The quick brown", "A recipe", "Neuron compiles")]
        results = await asyncio.gather(*neighbours, call)
        return results[-1].choices[0].text

    alone = asyncio.run(run(False))
    assert asyncio.run(run(True)) == alone


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"best_of": 3}, "best_of"),
        ({"suffix": "!"}, "suffix"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
        ({"logprobs": 21}, "logprobs"),
    ],
)
def test_unsupported_fields_are_refused_by_name(client, extra, param):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=NAME, prompt="hi", max_tokens=2, extra_body=extra)
    assert exc.value.body["param"] == param


def test_neutral_values_and_unknown_names_pass(client):
    out = client.completions.create(model=NAME, prompt="hi", max_tokens=2, presence_penalty=0,
                                    extra_body={"response_format": {"type": "text"}, "some_future_field": 1})
    assert out.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], top_logprobs=2)
    assert exc.value.body["param"] == "top_logprobs"
