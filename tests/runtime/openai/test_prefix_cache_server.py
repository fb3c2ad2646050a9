"""Prefix caching and chunked prefill through the OpenAI server on loopback, driven by the openai client: a
conversation's turns reuse the turns before them (``/metrics``: vLLM's prefix_cache_queries / prefix_cache_hits), the
answers are those of a server without the cache and of transformers, and a prompt longer than the largest context
bucket is answered instead of refused."""

from __future__ import annotations

import httpx
import openai
import pytest

from neuronpack.runtime.engine import Engine
from neuronpack.runtime.engine.prefix_cache import PrefixCaching
from tests.runtime.serving import engine_server, hf_greedy, metric_value

NAME = "tiny"
SYSTEM = "Be brief."


@pytest.fixture(scope="module")
def servers(compiled_lm, artifact_tokenizer):
    """Two servers on one loaded artifact: prefix caching on (the default) and off. (The engines take turns with the
    model's KV cache: the cached one forgets its prefixes whenever the other ran in between.)"""
    with engine_server(Engine(compiled_lm, artifact_tokenizer), served_model_name=NAME) as cached, \
            engine_server(Engine(compiled_lm, artifact_tokenizer, prefix_caching=PrefixCaching(enabled=False)),
                          served_model_name=NAME) as plain:
        yield cached, plain


def client_of(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(live, messages) -> str:
    out = client_of(live).chat.completions.create(model=NAME, messages=messages, max_tokens=6, temperature=0)
    return out.choices[0].message.content


def cache_counters(live) -> tuple[float, float]:
    text = httpx.get(f"{live.url}/metrics").text
    return (metric_value(text, "neuronpack_prefix_cache_queries_total"),
            metric_value(text, "neuronpack_prefix_cache_hits_total"))


def test_a_conversation_reuses_its_earlier_turns(servers):
    cached, plain = servers
    turns = ["A build?", "A recipe?", "Again."]
    expected, messages = [], [{"role": "system", "content": SYSTEM}]
    for turn in turns:  # the reference conversation first: the engines do not share cached prefixes
        messages.append({"role": "user", "content": turn})
        expected.append(chat(plain, messages))
        messages.append({"role": "assistant", "content": expected[-1]})
    answers, messages = [], [{"role": "system", "content": SYSTEM}]
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        answers.append(chat(cached, messages))
        messages.append({"role": "assistant", "content": answers[-1]})
    assert answers == expected
    queries, hits = cache_counters(cached)
    tok = cached.engine.tokenizer
    first_prompt = len(tok.encode_chat(messages[:2]))
    assert hits >= first_prompt - 2 and queries > hits  # turns 2 and 3 start with the whole of the turn before
    assert cache_counters(plain) == (0, 0)


def test_a_prompt_longer_than_the_largest_bucket_is_answered(servers, tiny_llama):
    cached, _ = servers
    tok = cached.engine.tokenizer
    prompt = "The quick brown fox jumps over the lazy dog. " * 5
    ids = tok.encode(prompt)
    assert 64 < len(ids) < 120  # beyond the largest context bucket (64), within max model length (128)
    client = client_of(cached)
    out = client.completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0)
    assert out.usage.prompt_tokens == len(ids)
    assert out.choices[0].text == tok.decode(hf_greedy(tiny_llama, ids, 6))
    streamed = "".join(c.choices[0].text for c in client.completions.create(model=NAME, prompt=prompt, max_tokens=6,
                                                                          temperature=0, stream=True))
    assert streamed == out.choices[0].text


def test_scoring_a_prompt_with_n_2_answers_both_choices(servers):
    """echo + max_tokens 0 + n 2: the group's second member ends with the first (it used to be left holding a row
    with no token, and the request never answered); only the leader's row, which holds the prompt's KV, is cached."""
    cached, _ = servers
    out = client_of(cached).completions.create(model=NAME, prompt="Score this sentence, please.", max_tokens=0,
                                               echo=True, logprobs=1, n=2)
    assert [c.index for c in out.choices] == [0, 1]
    assert out.choices[0].logprobs.token_logprobs == out.choices[1].logprobs.token_logprobs
    assert all(c.finish_reason == "length" for c in out.choices)
