"""`serve --reasoning-parser qwen3` end to end: the openai client against the server on loopback, over a compiled
artifact of a scripted model (tests/helpers/scripted_models.py) with Qwen3's tokenizer layout and chat template.

The model writes ``<think>Let me see</think>\\n\\n Paris is nice<|im_end|>`` after Qwen3's generation prompt, and
`` Paris is nice<|im_end|>`` after the prompt of ``enable_thinking`` false (which closes the reasoning itself)."""

import json

import httpx
import openai
import pytest

from tests.helpers.scripted_models import QUESTION, make_qwen3_demo
from tests.runtime.serving import EXPORT, LiveServer, build_artifact, hf_greedy

NAME = "qwen3-tiny"
REASONING, CONTENT = "Let me see", "\n\n Paris is nice"
CITY = {"type": "object", "properties": {"city": {"const": "Paris"}}, "required": ["city"],
        "additionalProperties": False}


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """(checkpoint, artifact, the prompt ids of QUESTION with thinking on / off, the tokens the model writes)."""
    root = tmp_path_factory.mktemp("qwen3-scripted")
    model, thinking, plain, written = make_qwen3_demo(root / "model")
    # Qwen3's tool instructions take ~440 tokens of this small vocabulary: a longer model length than the usual 128
    overrides = [*EXPORT, "target.seq_len=512", "buckets.token_generation=[64, 512]"]
    return model, build_artifact(model, root / "store", overrides), thinking, plain, written


@pytest.fixture(scope="module")
def server(scripted):
    from neuronpack.artifacts.manifest import read_manifest
    from neuronpack.progress import NullReporter
    from neuronpack.runtime.launch import ServeOptions, serve_launch

    artifact = scripted[1]
    options = ServeOptions(served_model_name=NAME, threads=1, reasoning_parser="qwen3")
    served = serve_launch(artifact, read_manifest(artifact), options).build(NullReporter())
    with LiveServer(served.app) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client, max_tokens=24, **kwargs):
    return client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=max_tokens, temperature=0,
                                          **kwargs)


def streamed(client, **kwargs):
    """(reasoning_content, content, tool-call argument text, finish_reason, usage, deltas) of a stream."""
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}, **kwargs))
    deltas = [c.choices[0].delta.model_dump(exclude_none=True) for c in chunks if c.choices]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    assert reasoning == "".join(d.get("reasoning", "") for d in deltas)  # both names, one text
    arguments = "".join(t["function"].get("arguments") or "" for d in deltas for t in d.get("tool_calls", ()))
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return reasoning or None, "".join(d.get("content", "") for d in deltas) or None, arguments, finish, \
        chunks[-1].usage, deltas


def reasoning_of(message):
    extra = message.model_extra
    assert extra["reasoning_content"] == extra["reasoning"]
    return extra["reasoning_content"]


def test_the_scripted_model_writes_its_script_in_transformers(scripted):
    model, _, thinking, plain, written = scripted
    assert hf_greedy(model, thinking, 24) == written
    assert hf_greedy(model, plain, 24) == written[len(written) - 4:]


def test_reasoning_content_and_content_split_as_vllm_splits_them(client, scripted):
    out = chat(client)
    message = out.choices[0].message
    assert reasoning_of(message) == REASONING and message.content == CONTENT
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.prompt_tokens == len(scripted[2]) and out.usage.completion_tokens == len(scripted[4])
    reasoning, content, _, finish, usage, deltas = streamed(client)
    assert (reasoning, content, finish) == (REASONING, CONTENT, ["stop"])
    assert (usage.prompt_tokens, usage.completion_tokens) == (out.usage.prompt_tokens, out.usage.completion_tokens)
    assert not any("reasoning" in d and "content" in d for d in deltas[1:])  # after the role chunk: one kind each


def test_enable_thinking_false_reaches_the_template_and_makes_it_all_content(client, scripted):
    for kwargs in ({"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
                   {"reasoning_effort": "none"}):  # vLLM: effort "none" turns thinking off for the template
        out = chat(client, **kwargs)
        assert out.usage.prompt_tokens == len(scripted[3])  # the prompt closes an empty <think></think>
        assert out.choices[0].message.content == " Paris is nice" and reasoning_of(out.choices[0].message) is None
        assert streamed(client, **kwargs)[:2] == (None, " Paris is nice")


def test_a_response_cut_inside_the_reasoning_is_all_reasoning(client):
    out = chat(client, max_tokens=4)  # <think> Let Ġm e
    assert out.choices[0].finish_reason == "length"
    assert reasoning_of(out.choices[0].message) == "Let me" and out.choices[0].message.content is None
    assert streamed(client, max_tokens=4)[:2] == ("Let me", None)


def test_include_reasoning_false_drops_it(client):
    out = chat(client, extra_body={"include_reasoning": False})
    assert reasoning_of(out.choices[0].message) is None and out.choices[0].message.content == CONTENT
    reasoning, content, *_, deltas = streamed(client, logprobs=True, extra_body={"include_reasoning": False})
    assert (reasoning, content) == (None, CONTENT)
    chunks = list(chat(client, stream=True, logprobs=True, extra_body={"include_reasoning": False}))
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices)  # their tokens would show the reasoning


def test_structured_output_applies_after_the_reasoning(client):
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    out = chat(client, response_format=response_format)
    message = out.choices[0].message
    assert reasoning_of(message) == REASONING and json.loads(message.content) == {"city": "Paris"}
    assert streamed(client, response_format=response_format)[:2] == (REASONING, '{"city":"Paris"}')


def test_a_forced_tool_call_follows_the_reasoning(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    out = chat(client, tools=tools, tool_choice=choice)
    message = out.choices[0].message
    assert reasoning_of(message) == REASONING
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == \
        [("get_weather", {"city": "Paris"})]
    reasoning, _, arguments, _, _, _ = streamed(client, tools=tools, tool_choice=choice)
    assert reasoning == REASONING and json.loads(arguments) == {"city": "Paris"}


def test_history_reasoning_reaches_the_template_and_models_are_unchanged(client, server, scripted):
    """Qwen3's template renders an assistant's reasoning_content after the last question (a tool-calling turn); the
    client may send it under vLLM's newer name, reasoning, too."""
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    tok = ArtifactTokenizer.from_dir(scripted[1])
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    for name in ("reasoning_content", "reasoning"):
        history = [*QUESTION, {"role": "assistant", "content": None, name: "I need the weather.", "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
        out = client.chat.completions.create(model=NAME, messages=history, max_tokens=2, temperature=0)
        rendered = [{**m, "reasoning_content": "I need the weather."} if m["role"] == "assistant" else m
                    for m in history]
        expected = tok.apply_chat_template(rendered)
        assert "<think>\nI need the weather.\n</think>" in expected
        assert out.usage.prompt_tokens == len(tok.encode(expected, add_special_tokens=False))
    assert [m.id for m in client.models.list().data] == [NAME]


def test_chat_template_kwargs_the_server_sets_itself_are_refused(client, server):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, extra_body={"chat_template_kwargs": {"chat_template": "{{ 1 }}"}})
    assert "Found unexpected chat template kwargs from request: ['chat_template']" in err.value.body["message"]
    # a plain HTTP client sees the same request refused before anything is generated
    body = {"model": NAME, "messages": QUESTION, "chat_template_kwargs": {"tokenize": True}}
    assert httpx.post(f"{server.url}/v1/chat/completions", json=body).status_code == 400


@pytest.mark.slow  # a second compile, with prompt-lookup speculation
def test_prompt_lookup_drafts_across_the_end_of_the_reasoning(scripted, tmp_path):
    """Speculation with a grammar behind the reasoning: the prompt holds the script, so prompt lookup drafts
    "</think>", "\\n\\n", " Paris" ...; the drafted reasoning is free, the grammar cuts the draft after "</think>". The
    answer is the one plain decoding gives."""
    from neuronpack.backends.torch_aot import load_artifact
    from neuronpack.runtime.engine import Engine
    from neuronpack.runtime.engine.metrics import metric_value
    from neuronpack.runtime.engine.speculation.config import SpeculationConfig
    from neuronpack.runtime.openai.chat_format import TemplateChat
    from neuronpack.runtime.openai.reasoning import ThinkParser
    from neuronpack.runtime.tokenizer import ArtifactTokenizer
    from tests.runtime.conftest import SPECULATION
    from tests.runtime.serving import engine_server

    overrides = [*EXPORT, *SPECULATION, "target.seq_len=512", "buckets.token_generation=[64, 512]"]
    artifact = build_artifact(scripted[0], tmp_path / "store", overrides)
    tok = ArtifactTokenizer.from_dir(artifact)
    engine = Engine(load_artifact(artifact), tok,
                    speculation=SpeculationConfig("prompt_lookup", 3, prompt_lookup_min=1, prompt_lookup_max=3))
    chat_format = TemplateChat(ThinkParser.load("qwen3", tok.token_id))
    # (a prompt whose last tag is </think> would have closed the reasoning: vLLM's is_reasoning_end, here too)
    messages = [{"role": "user", "content": "Repeat:\nLet me see</think>\n\n Paris is nice, then <think>"}]
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    with engine_server(engine, served_model_name=NAME, chat_format=chat_format) as live:
        speculating = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=120)
        out = speculating.chat.completions.create(model=NAME, messages=messages, max_tokens=24, temperature=0,
                                                  response_format=response_format)
        accepted = metric_value(httpx.get(f"{live.url}/metrics").text,
                                "neuronpack_spec_decode_num_accepted_tokens_total")
    assert reasoning_of(out.choices[0].message) == REASONING
    assert json.loads(out.choices[0].message.content) == {"city": "Paris"} and accepted > 0
