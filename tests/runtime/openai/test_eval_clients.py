"""Smoke tests with clients nobody here wrote (bounded: the tiny model, a few examples; marked slow: each client
starts a fresh interpreter). The full runs on SmolLM2-135M are ``make eval-clients`` (bench/eval_clients.py)."""

import pytest

from neuronpack.runtime.engine import Engine
from neuronpack.runtime.openai.server import create_app
from tests.helpers.eval_clients import hf_args, local_completions_args, run_guidellm, run_lm_eval
from tests.runtime.serving import LiveServer

NAME = "tiny"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(compiled_lm, artifact_tokenizer):
    with LiveServer(create_app(Engine(compiled_lm, artifact_tokenizer), served_model_name=NAME)) as live:
        yield live


def test_lm_eval_local_completions_equals_its_hf_model(server, tiny_llama, tmp_path):
    served, reference = run_lm_eval([("local-completions", local_completions_args(server.url, NAME, tiny_llama)),
                                     ("hf", hf_args(tiny_llama))], tmp_path, limit=6, batch_size=4)
    assert len(served.loglikelihoods) == 6 and all(len(lls) == 4 for lls in served.loglikelihoods)
    assert served.acc == reference.acc
    for ours, theirs in zip(served.loglikelihoods, reference.loglikelihoods, strict=True):
        assert ours == pytest.approx(theirs, abs=1e-3)
    assert served.is_greedy == reference.is_greedy


def test_guidellm_benchmark_runs_to_completion(server, tiny_llama, tmp_path):
    rows = run_guidellm(server.url, NAME, tiny_llama, tmp_path / "guidellm.json", max_requests=4, output_tokens=8)
    (row,) = rows
    assert row["requests"]["successful"] == 4 and row["requests"]["errored"] == 0
    assert row["output_tokens_per_request"] == 8  # ignore_eos honoured: exactly the asked length
    assert row["output_tokens_per_s"] > 0 and row["ttft_ms_p50"] > 0
