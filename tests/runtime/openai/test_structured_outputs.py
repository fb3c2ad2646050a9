"""Structured outputs and tool calling over HTTP with real clients (openai, LangChain) against the tiny model: every
constrained completion matches its schema / regex / choice, whatever the sampling (hypothesis: random JSON Schemas,
temperature 1, n > 1, with prompt-lookup speculation too); tool calls streamed and not; bad input is a 400 naming
the field, and leaves no request behind."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from neuronpack.runtime.engine import Engine, GenerationRequest
from neuronpack.runtime.engine.sampling import SamplingParams
from neuronpack.runtime.engine.speculation.config import SpeculationConfig
from neuronpack.runtime.structured import GrammarSpec
from neuronpack.runtime.tokenizer import ArtifactTokenizer
from tests.runtime.engine.test_eagle_engine import (  # noqa: F401 (a module fixture: a random EAGLE draft)
    eagle,
    random_draft,
)
from tests.runtime.serving import engine_server, metric_value

NAME = "tiny"
# The tiny template plus a mention of ``tools``: a template that renders tools itself gets no injected instructions
# (the tiny artifact's 64-token context has no room for them).
TOOLS_AWARE = "{% if tools %}{% endif %}"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 6}, "days": {"type": "integer",
    "minimum": 1, "maximum": 7}}, "required": ["city", "days"], "additionalProperties": False}}}
HI = [{"role": "user", "content": "Weather?"}]


class City(BaseModel):
    name: str = Field(max_length=8)
    population: int = Field(ge=0, le=10_000)
    capital: bool


@pytest.fixture(scope="module")
def server(compiled_lm, serve_artifact):
    tokenizer = ArtifactTokenizer.from_dir(serve_artifact)
    tokenizer.chat_template += TOOLS_AWARE
    with engine_server(Engine(compiled_lm, tokenizer), served_model_name=NAME) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def test_parse_with_a_pydantic_model_returns_the_parsed_object(client):
    for temperature in (0.0, 1.0):
        out = client.chat.completions.parse(model=NAME, messages=HI, response_format=City, max_tokens=100,
                                            temperature=temperature, seed=1)
        choice = out.choices[0]
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, City)
        assert City.model_validate_json(choice.message.content) == choice.message.parsed


def test_json_object_regex_choice_and_grammar_on_both_endpoints(client):
    obj = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=60,
                                         temperature=0,
                                         response_format={"type": "json_object"})
    assert obj.choices[0].finish_reason == "stop" and isinstance(json.loads(obj.choices[0].message.content), dict)
    cases = [({"guided_regex": "[a-c]{2,4}-[0-9]{2}"}, lambda t: re.fullmatch("[a-c]{2,4}-[0-9]{2}", t)),
             ({"guided_choice": ["yes", "no", "maybe so"]}, lambda t: t in ("yes", "no", "maybe so")),
             ({"structured_outputs": {"choice": ["left", "right"]}}, lambda t: t in ("left", "right")),
             ({"guided_grammar": 'root ::= "ab" [0-9] | "c"'}, lambda t: re.fullmatch("ab[0-9]|c", t)),
             ({"guided_json": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
              lambda t: isinstance(json.loads(t), list))]
    for extra, matches in cases:
        text = client.completions.create(model=NAME, prompt="Hello", max_tokens=40, temperature=1.0, seed=2,
                                         extra_body=extra).choices[0]
        assert text.finish_reason == "stop" and matches(text.text), (extra, text.text)
        streamed = client.completions.create(model=NAME, prompt="Hello", max_tokens=40, temperature=1.0, seed=2,
                                             stream=True, extra_body=extra)
        assert "".join(c.choices[0].text for c in streamed) == text.text


def test_max_tokens_mid_object_ends_with_length(client):
    out = client.chat.completions.create(model=NAME, messages=HI, max_tokens=3, temperature=0,
                                         response_format={"type": "json_schema", "json_schema": {
                                             "name": "city", "schema": City.model_json_schema()}})
    assert out.choices[0].finish_reason == "length" and out.choices[0].message.content.startswith("{")


def _leaf():
    return st.one_of(
        st.just({"type": "boolean"}), st.just({"type": "null"}),
        st.integers(-50, 50).map(lambda lo: {"type": "integer", "minimum": lo, "maximum": lo + 20}),
        st.integers(0, 3).map(lambda n: {"type": "string", "maxLength": n}),
        st.lists(st.sampled_from(["x", "yy", "z z"]), min_size=1, max_size=3, unique=True).map(lambda e: {"enum": e}),
    )


def _schemas():
    def grow(children):
        obj = st.dictionaries(st.sampled_from("abc"), children, min_size=1, max_size=2).map(
            lambda props: {"type": "object", "properties": props, "required": sorted(props),
                           "additionalProperties": False})
        array = st.tuples(children, st.integers(0, 2)).map(
            lambda t: {"type": "array", "items": t[0], "maxItems": t[1]})
        optional = children.map(lambda s: {"anyOf": [s, {"type": "null"}]})  # what pydantic emits for X | None
        return st.one_of(obj, array, optional)

    return st.recursive(_leaf(), grow, max_leaves=4)


def _assert_valid_completions(client, schema, prompt, seed):
    out = client.completions.create(model=NAME, prompt=prompt, max_tokens=110, temperature=1.0, n=3, seed=seed,
                                    extra_body={"guided_json": schema})
    for choice in out.choices:
        assert choice.finish_reason == "stop", (schema, choice.text)
        jsonschema.validate(json.loads(choice.text), schema)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=_schemas(), seed=st.integers(0, 2**31))
def test_random_schemas_sampled_at_temperature_1_always_validate(client, schema, seed):
    _assert_valid_completions(client, schema, "Hi", seed)


@pytest.fixture(scope="module")
def spec_client(spec_lm, spec_tokenizer):
    config = SpeculationConfig("prompt_lookup", 3, prompt_lookup_min=1, prompt_lookup_max=3)
    with engine_server(Engine(spec_lm, spec_tokenizer, speculation=config), served_model_name=NAME) as live:
        yield openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0, timeout=120), live


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=_schemas(), seed=st.integers(0, 2**31))
def test_random_schemas_validate_with_prompt_lookup_speculation(spec_client, schema, seed):
    # A prompt full of JSON: prompt lookup drafts from it, the grammar cuts and masks the drafts.
    _assert_valid_completions(spec_client[0], schema, '{"a":null,"b":[true,false]} {"a":null,"b":[', seed)


def test_speculation_drafted_for_constrained_requests(spec_client):
    client, live = spec_client
    schema = {"type": "object", "properties": {"a": {"enum": ["xyz xyz"]}, "b": {"enum": ["xyz xyz"]}},
              "required": ["a", "b"], "additionalProperties": False}
    out = client.completions.create(model=NAME, prompt='{"a":"xyz xyz","b":"xyz xyz"} {"a":"xyz xyz",', max_tokens=40,
                                    temperature=0, extra_body={"guided_json": schema})
    assert json.loads(out.choices[0].text) == {"a": "xyz xyz", "b": "xyz xyz"}
    assert metric_value(httpx.get(f"{live.url}/metrics").text, "neuronpack_spec_decode_num_accepted_tokens_total") > 0
    # Greedy: the same tokens as plain constrained decoding, for a schema the model does not fill by itself.
    free = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 6}, "b": {"type": "integer"}},
            "required": ["a", "b"], "additionalProperties": False}
    plain = Engine(live.engine.model, live.engine.tokenizer)
    prompt = '{"a":"xyz","b":12} {"a":"xyz","b":12} {"a":"'
    spec = client.completions.create(model=NAME, prompt=prompt, max_tokens=30, temperature=0,
                                     extra_body={"guided_json": free}).choices[0].text
    grammar = plain.grammars.compile(GrammarSpec.json_schema(free, param="guided_json"))
    request = GenerationRequest(prompt_ids=tuple(plain.tokenizer.encode(prompt)), max_tokens=30, grammar=grammar,
                                sampling=SamplingParams(temperature=0))
    assert plain.generate(request).text == spec


def test_tool_calls_required_named_and_auto_streamed_and_not(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    schema = WEATHER["function"]["parameters"]
    for choice, finish in (("required", "tool_calls"), (named, "stop")):
        out = client.chat.completions.create(model=NAME, messages=HI, tools=[WEATHER], tool_choice=choice,
                                             parallel_tool_calls=False, max_tokens=60, temperature=1.0, seed=4)
        message = out.choices[0].message
        assert out.choices[0].finish_reason == finish and message.content is None
        [call] = message.tool_calls
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), schema)
        chunks = list(client.chat.completions.create(model=NAME, messages=HI, tools=[WEATHER], tool_choice=choice,
                                                     parallel_tool_calls=False, max_tokens=60, temperature=1.0,
                                                     seed=4, stream=True))
        deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or ())]
        assert deltas[0].id and deltas[0].function.name == "get_weather" and deltas[0].type == "function"
        assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
        assert chunks[-1].choices[0].finish_reason == finish
    # auto: the model's own Hermes format (forced here by a regex, the tiny model is random) becomes tool_calls
    hermes = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "Oslo", "days": 2\}\}</tool_call>'
    kwargs = dict(model=NAME, messages=HI, tools=[WEATHER], tool_choice="auto", max_tokens=110,
                  extra_body={"guided_regex": r"Sure\. " + hermes})
    out = client.chat.completions.create(**kwargs)
    assert out.choices[0].finish_reason == "tool_calls" and out.choices[0].message.content == "Sure."
    assert json.loads(out.choices[0].message.tool_calls[0].function.arguments) == {"city": "Oslo", "days": 2}
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks).strip() == "Sure."
    [call] = [d for c in chunks for d in (c.choices[0].delta.tool_calls or ())]
    assert call.function.arguments == out.choices[0].message.tool_calls[0].function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_results_in_the_history_go_through_the_template(server):
    from neuronpack.runtime.openai.chat_prompt import chat_prompt
    from neuronpack.runtime.openai.schema import ChatCompletionRequest

    history = [*HI, {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    body = ChatCompletionRequest.model_validate({"model": NAME, "messages": history, "tools": [WEATHER]})
    prompt_ids, grammar = chat_prompt(server.engine, body, body.tool_plan())
    prompt = server.engine.tokenizer.decode(prompt_ids)
    # The tiny template knows no tool_calls: the call is rendered in the Hermes format the model is asked to write.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}\n</tool_call>' in prompt
    assert prompt.index("</tool_call>") < prompt.index("tool\nsunny") and grammar is None


def test_langchain_with_structured_output(server):
    import langchain_openai
    llm = langchain_openai.ChatOpenAI(model=NAME, base_url=f"{server.url}/v1", api_key="none", temperature=0,
                                      max_tokens=100, max_retries=0)
    city = llm.with_structured_output(City, method="json_schema").invoke("A city?")
    assert isinstance(city, City)


@pytest.mark.parametrize(("extra", "param", "reason"), [
    ({"guided_regex": "[a-"}, "guided_regex", "unclosed character class"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/no"}}}},
     "response_format.json_schema.schema", "does not exist"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema",
     "missing"),
    # a schemathesis negative case: 0.0 is neither a schema nor a boolean, even when type "text" ignores it
    ({"response_format": {"type": "text", "json_schema": {"schema": 0.0}}}, "response_format.json_schema.schema",
     "valid dictionary"),
    ({"guided_json": {"type": "strin"}}, "guided_json", "strin"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_grammar": "root ::= undefined_rule"}, "guided_grammar", "undefined_rule"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "both constrain"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "does not declare"),
    ({"tool_choice": "required"}, "tool_choice", "needs at least one function"),
    ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "guided_regex", "cannot be combined"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name", "pattern"),
])
def test_bad_structured_input_is_a_400_naming_the_field(client, server, extra, param, reason):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=NAME, messages=HI, max_tokens=5, extra_body=extra)
    assert exc.value.body["param"] == param and reason in exc.value.body["message"]
    assert server.engine.in_flight == 0 and server.engine.scheduler.idle


def test_compiled_grammars_are_cached_by_schema(client, server):
    grammars = server.engine.grammars
    schema = {"type": "object", "properties": {"q": {"type": "boolean"}}, "required": ["q"]}
    before = grammars.misses
    for _ in range(3):
        client.completions.create(model=NAME, prompt="Hi", max_tokens=20, extra_body={"guided_json": schema})
    assert grammars.misses == before + 1


def test_eagle_speculation_keeps_constrained_greedy_tokens(spec_lm, spec_tokenizer, request):
    draft = request.getfixturevalue("random_draft")[1]
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}, "b": {"type": "boolean"}},
              "required": ["a", "b"], "additionalProperties": False}
    spec = Engine(spec_lm, spec_tokenizer, speculation=eagle(draft))
    plain = Engine(spec_lm, spec_tokenizer)
    grammar = plain.grammars.compile(GrammarSpec.json_schema(schema, param="guided_json"))
    for text in ("abc abc abc", '{"a":"x","b":true} {"a":"x",'):
        job = GenerationRequest(prompt_ids=tuple(spec_tokenizer.encode(text)), max_tokens=40, grammar=grammar,
                                sampling=SamplingParams(temperature=0))
        ours, theirs = spec.generate(job), plain.generate(job)
        assert ours.token_ids == theirs.token_ids and ours.finish_reason == "stop"
        jsonschema.validate(json.loads(ours.text), schema)
        assert ours.speculation["num_draft_tokens"] > 0
