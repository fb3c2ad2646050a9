"""The engine speculating with prompt lookup on a real compiled artifact (verify calls of up to k + 1 tokens):
greedy output equals the same artifact without speculation, continuous batching, stop rules inside a step, the
max_model_len boundary, sampled requests, metrics and ``generate --format json``."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from typer.testing import CliRunner

from neuronpack.cli.app import app
from neuronpack.runtime.engine import Engine, GenerationRequest
from neuronpack.runtime.engine.metrics import metric_value
from neuronpack.runtime.engine.sampling import SamplingParams
from neuronpack.runtime.engine.speculation.config import SpeculationConfig
from neuronpack.runtime.openai.server import create_app
from tests.runtime.serving import LiveServer, run_all

GREEDY = SamplingParams(temperature=0.0)
K = 3
CONFIG = SpeculationConfig("prompt_lookup", K, prompt_lookup_min=1, prompt_lookup_max=3)
# Repetitive prompts: the tiny model copies some of them, so drafts are kept as well as rejected.
TEXTS = ["abc abc abc abc abc abc", "The quick brown fox", "one two one two one two one", "Hello world! How are",
         "xyz xyz xyz", "1 2 3 1 2 3 1 2 3"]


@pytest.fixture
def engines(spec_lm, spec_tokenizer):
    """(speculating, plain) engines over the same loaded artifact."""
    return Engine(spec_lm, spec_tokenizer, speculation=CONFIG), Engine(spec_lm, spec_tokenizer)


def request(tok, text, max_tokens=40, **kwargs) -> GenerationRequest:
    return GenerationRequest(prompt_ids=tuple(tok.encode(text)), sampling=kwargs.pop("sampling", GREEDY),
                             max_tokens=max_tokens, **kwargs)


def test_the_artifact_records_its_speculation(spec_lm, spec_artifact):
    config = json.loads((spec_artifact / "neuron_config.json").read_text())
    assert config["speculation"] == {"kind": "prompt_lookup", "length": K, "prompt_lookup_min": 1,
                                     "prompt_lookup_max": 3}
    assert spec_lm.max_verify_tokens >= K + 1  # the step graph: up to the longest prompt, at least k + 1
    manifest = json.loads((spec_artifact / "neuronpack.json").read_text())
    assert manifest["serve"]["speculation_length"] == K and manifest["recipe"]["speculation"]["kind"] == "prompt_lookup"


def test_greedy_batch_equals_plain_decoding(engines):
    spec, plain = engines
    tok = spec.tokenizer
    reqs = [request(tok, t, max_tokens=30 + 3 * i, ignore_eos=True) for i, t in enumerate(TEXTS)]
    expected = run_all(plain, reqs)
    got = run_all(spec, reqs)
    assert got == expected
    text = spec.metrics.render().decode()
    drafted = metric_value(text, "neuronpack_spec_decode_num_draft_tokens_total")
    accepted = metric_value(text, "neuronpack_spec_decode_num_accepted_tokens_total")
    assert drafted > 0 and 0 < accepted < drafted
    assert metric_value(text, "neuronpack_spec_decode_num_drafts_total") > 0
    per_pos = [metric_value(text, "neuronpack_spec_decode_num_accepted_tokens_per_pos_total", f'position="{i}"')
               for i in range(K)]
    assert sum(per_pos) == accepted and per_pos[0] >= per_pos[1] >= per_pos[2]
    assert "spec_decode" not in plain.metrics.render().decode()  # registered only when speculating


def test_several_tokens_per_step_and_stats(engines):
    spec, plain = engines
    req = request(spec.tokenizer, TEXTS[0], max_tokens=40, ignore_eos=True)
    result = spec.generate(req)
    assert result.token_ids == plain.generate(req).token_ids
    s = result.speculation
    assert s["steps"] < result.completion_tokens - 1  # fewer model steps than tokens after the first
    assert s["tokens_per_step"] == pytest.approx((result.completion_tokens - 1) / s["steps"])
    assert s["acceptance_rate"] == pytest.approx(s["num_accepted_tokens"] / s["num_draft_tokens"])
    assert plain.generate(req).speculation is None


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 9])
def test_max_tokens_cuts_inside_a_step(engines, max_tokens):
    spec, plain = engines
    req = request(spec.tokenizer, TEXTS[0], max_tokens=max_tokens, ignore_eos=True)
    got = spec.generate(req)
    assert got.token_ids == plain.generate(req).token_ids and len(got.token_ids) == max_tokens
    assert got.finish_reason == "length"


def test_stop_token_and_stop_string_truncate_what_follows(engines):
    spec, plain = engines
    tok = spec.tokenizer
    full = plain.generate(request(tok, TEXTS[0], max_tokens=30, ignore_eos=True))
    stop_id = full.token_ids[12]
    for kwargs in ({"stop_token_ids": (stop_id,)}, {"stop": (tok.decode(full.token_ids[10:13]),)}):
        req = request(tok, TEXTS[0], max_tokens=30, ignore_eos=True, **kwargs)
        a, b = plain.generate(req), spec.generate(req)
        assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, a.finish_reason)
        assert a.finish_reason == "stop" and len(a.token_ids) <= 13


def test_max_model_len_boundary_with_real_verify_calls(spec_lm, spec_tokenizer, monkeypatch):
    """A sequence at length L with L + k > max_model_len finishes with "length" one iteration early (never an
    error); up to then it speculates, its verify calls (padded to the batch's longest draft) end inside the cache."""
    ends: list[int] = []
    verify = spec_lm.verify

    def spy(slots, token_rows, starts, **kwargs):  # the real verify, recording where each call ends
        ends.append(max(s + len(token_rows[0]) for s in starts))
        return verify(slots, token_rows, starts, **kwargs)

    monkeypatch.setattr(spec_lm, "verify", spy)
    prompt = tuple(range(5, 25)) * 3  # 60 tokens, repeating: lookup drafts from the first step on
    for max_model_len, expected in ((70, 8), (None, 66)):  # None: the compiled 128; stops at 126 (126 + 3 > 128)
        ends.clear()
        spec = Engine(spec_lm, spec_tokenizer, max_model_len=max_model_len, speculation=CONFIG)
        plain = Engine(spec_lm, spec_tokenizer, max_model_len=max_model_len)
        req = GenerationRequest(prompt_ids=prompt, sampling=GREEDY, ignore_eos=True)
        a, b = plain.generate(req), spec.generate(req)
        assert (b.finish_reason, b.completion_tokens) == ("length", expected)
        assert b.token_ids == a.token_ids[:expected]
        limit = max_model_len or 128
        assert b.speculation["num_draft_tokens"] > 0 and ends and max(ends) <= limit
        assert max(ends) >= limit - 3  # it speculated right up to the boundary


def test_sampled_requests_are_seeded_and_finish(engines):
    spec, _ = engines
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=7, logprobs=2)
    req = request(spec.tokenizer, TEXTS[2], max_tokens=24, ignore_eos=True, sampling=params)
    outs: list = []
    spec.submit(req, outs.append)
    while spec.step():
        pass
    tokens = [t for o in outs for t in o.token_ids]
    entries = [e for o in outs for e in (o.logprobs or ())]
    assert len(tokens) == 24 and [e.token_id for e in entries] == tokens  # one logprob entry per token
    assert all(e.logprob <= 0.0 and len(e.top) == 2 for e in entries)
    again = spec.generate(request(spec.tokenizer, TEXTS[2], max_tokens=24, ignore_eos=True, sampling=params))
    assert again.token_ids == tokens  # the request's own generator: reproducible with its seed


def test_generate_json_reports_speculation(spec_artifact):
    runner = CliRunner()
    args = ["generate", str(spec_artifact), "--prompt", TEXTS[0], "--max-tokens", "16", "--format", "json"]
    on = runner.invoke(app, args)
    off = runner.invoke(app, [*args, "--no-speculation"])
    assert on.exit_code == 0 and off.exit_code == 0, on.output + off.output
    a, b = json.loads(on.stdout), json.loads(off.stdout)
    assert a["tokens"] == b["tokens"] and "speculation" not in b
    s = a["speculation"]
    assert s["kind"] == "prompt_lookup" and s["length"] == K and s["steps"] > 0
    assert {"acceptance_rate", "mean_acceptance_length", "tokens_per_step", "num_draft_tokens"} <= set(s)
    # figures rounded as the timings are (tokens_per_step was 2.6666666666666665)
    ratios = [s[k] for k in ("acceptance_rate", "mean_acceptance_length", "tokens_per_step") if s[k] is not None]
    assert ratios and all(value == round(value, 4) for value in ratios)
    assert all(v == round(v, 4) for v in a["timings"].values())


def test_server_streams_several_tokens_per_step_and_exposes_the_counters(engines):
    """Over HTTP with the openai client: a streamed completion of a speculating engine equals the plain engine's
    text, and /metrics carries the spec_decode counters."""
    spec, plain = engines
    tok = spec.tokenizer
    expected = tok.decode(plain.generate(request(tok, TEXTS[0], max_tokens=24)).token_ids)
    with LiveServer(create_app(spec, served_model_name="tiny")) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0, timeout=60)
        kwargs = dict(model="tiny", prompt=TEXTS[0], max_tokens=24, temperature=0)
        full = client.completions.create(**kwargs)
        streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True) if c.choices)
        metrics = httpx.get(f"{live.url}/metrics").text
    assert full.choices[0].text == streamed == expected
    assert metric_value(metrics, "neuronpack_spec_decode_num_drafts_total") > 0
    assert metric_value(metrics, "neuronpack_generation_tokens_total") == 2 * full.usage.completion_tokens
