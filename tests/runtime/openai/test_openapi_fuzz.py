"""schemathesis over the OpenAPI document the server publishes, against a real server on loopback.

The document declares the served model name (an enum on ``model``), so generated requests get past the model check
and reach the tokenizer and the engine. Every check schemathesis runs by default must hold (no 5xx, status codes,
content types, headers and bodies as declared, OpenAI error shapes included, schema-invalid data refused) except
"schema-valid data accepted": OpenAI's schema has fields this runtime refuses on purpose with a 400 naming them
(``n`` > 1, ``logit_bias``, ...), and whether a prompt fits is only known after tokenizing it.
"""

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from neuronpack.runtime.engine import Engine
from tests.runtime.serving import engine_server, metric_value

NAME = "tiny"
KEY = "sk-fuzz"
MAX_EXAMPLES = int(os.environ.get("NEURONPACK_FUZZ_EXAMPLES", "60"))  # per operation and mode: ~1 min on 2 cores
CASES: list[str] = []


@pytest.fixture(scope="module")
def fuzz_server(compiled_lm, artifact_tokenizer):
    with engine_server(Engine(compiled_lm, artifact_tokenizer), served_model_name=NAME, api_key=KEY) as live:
        yield live
    print(f"\nschemathesis: {len(CASES)} cases, by operation: "
          f"{ {op: CASES.count(op) for op in sorted(set(CASES))} }")


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_server):
    return schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")


OPERATIONS = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
              ("GET", "/health"), ("GET", "/metrics")]


# schemathesis' pytest plugin (from_fixture) does not run under pytest 9, so each operation's strategy drives a plain
# hypothesis test: the same generation and the same checks as `case.call_and_validate` in its own runner.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_every_generated_request_gets_a_declared_answer(fuzz_server, fuzz_schema, method, path, mode):
    operation = fuzz_schema[path][method]
    if mode is GenerationMode.NEGATIVE and method == "GET":
        pytest.skip("no parameters to make invalid")

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case):
        CASES.append(f"{mode.value} {method} {path}")
        case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                               excluded_checks=[positive_data_acceptance])

    run()


def test_the_fuzzed_server_is_idle_afterwards(fuzz_server):
    text = httpx.get(f"{fuzz_server.url}/metrics").text
    assert metric_value(text, "neuronpack_num_requests_running") == 0
    assert metric_value(text, "neuronpack_num_requests_waiting") == 0
    assert fuzz_server.engine.scheduler.idle and fuzz_server.engine.in_flight == 0
