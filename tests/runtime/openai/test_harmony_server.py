"""gpt-oss's harmony format end to end: the openai client against the server on loopback, over a compiled artifact of
a scripted model (tests/helpers/scripted_models.py) with gpt-oss's o200k_harmony tokenizer, which answers a harmony
prompt with a tool call on the commentary channel."""

import json

import openai
import pytest

from tests.helpers.harmony_vocab import VOCAB_SIZE, harmony_tokenizer
from tests.helpers.scripted_models import make_scripted_checkpoint
from tests.runtime.serving import EXPORT, build_artifact, engine_server, hf_greedy

pytestmark = pytest.mark.slow  # the o200k tokenizer's conversion and a 201k-vocabulary artifact: ~1 min to set up

NAME = "gpt-oss-tiny"
QUESTION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'


@pytest.fixture(scope="module")
def scripted(tmp_path_factory, harmony_encodings, harmony_encoding):
    """(checkpoint, artifact, the tokens the model writes after a harmony prompt)."""
    root = tmp_path_factory.mktemp("harmony-scripted")
    tok = harmony_tokenizer(harmony_encodings)
    last = harmony_encoding.encode("<|start|>assistant", allowed_special="all")[-1]  # every prompt's last token
    written = harmony_encoding.encode(CALL, allowed_special="all")
    model = make_scripted_checkpoint(root / "model", tok, [[last, *written]], vocab_size=VOCAB_SIZE)
    # harmony's system message and the tool's TypeScript take ~120 tokens: a longer model length than 128
    overrides = [*EXPORT, "target.seq_len=512", "buckets.token_generation=[64, 512]"]
    return model, build_artifact(model, root / "store", overrides), written


@pytest.fixture(scope="module")
def server(scripted):
    from neuronpack.backends.torch_aot import load_artifact
    from neuronpack.runtime.engine import Engine
    from neuronpack.runtime.launch import chat_format_for
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    artifact = scripted[1]
    engine = Engine(load_artifact(artifact), ArtifactTokenizer.from_dir(artifact))
    # the artifact is a Llama with gpt-oss's tokenizer: the format serve picks for model_type gpt_oss, given here
    chat, line = chat_format_for("gpt_oss", None, engine.tokenizer, where=str(artifact))
    assert line == "chat format: harmony (gpt-oss), reasoning parser openai_gptoss"
    with engine_server(engine, served_model_name=NAME, chat_format=chat) as live:
        live.chat = chat
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client, **kwargs):
    return client.chat.completions.create(model=NAME, messages=QUESTION, tools=[WEATHER], max_tokens=32,
                                          temperature=0, **kwargs)


def test_the_scripted_model_answers_with_the_call_in_transformers(scripted, server):
    from neuronpack.runtime.openai.schema import ChatCompletionRequest

    body = ChatCompletionRequest.model_validate({"model": NAME, "messages": QUESTION, "tools": [WEATHER]})
    prompt = server.chat.render(body, body.tool_plan())
    written = scripted[2]
    assert hf_greedy(scripted[0], prompt, 32)[: len(written)] == written  # transformers goes on past <|call|>


def test_the_commentary_channel_becomes_tool_calls(client, scripted):
    out = chat(client)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] is None
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == \
        [("function", "get_weather", {"city": "Paris"})]
    assert choice.model_extra["stop_reason"] == scripted[2][-1]  # stopped by harmony's <|call|>
    assert out.usage.completion_tokens == len(scripted[2])


def test_tool_calls_stream_as_vllm_streams_them(client):
    chunks = list(chat(client, stream=True))
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
    assert calls[0].index == 0 and calls[0].id.startswith("call_") and calls[0].type == "function"
    assert (calls[0].function.name, calls[0].function.arguments) == ("get_weather", "")
    assert all(t.index == 0 and t.id is None for t in calls[1:])
    assert json.loads("".join(t.function.arguments for t in calls)) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_a_structured_output_waits_for_the_final_channel(server):
    from neuronpack.runtime.openai.schema import ChatCompletionRequest

    body = ChatCompletionRequest.model_validate({"model": NAME, "messages": QUESTION,
                                                 "response_format": {"type": "json_object"}})
    prepared = server.chat.prepare(server.engine, body, None)
    header = server.chat.encoding.encode("<|start|>assistant<|channel|>final<|message|>", allowed_special="all")
    gate = prepared.grammar.gate
    assert gate.end == tuple(header) and gate.tail == tuple(prepared.prompt_ids[-4:]) and not gate.ended
    assert set(prepared.stop_token_ids) == set(server.chat.encoding.stop_tokens_for_assistant_actions())


def test_a_reasoning_parser_that_does_not_fit_the_model_is_refused(server):
    from neuronpack.errors import ServeError
    from neuronpack.runtime.launch import chat_format_for

    with pytest.raises(ServeError, match="gpt-oss chats in harmony"):
        chat_format_for("gpt_oss", "qwen3", server.engine.tokenizer, where="art")
    with pytest.raises(ServeError, match="openai_gptoss reads gpt-oss's harmony format"):
        chat_format_for("llama", "openai_gptoss", server.engine.tokenizer, where="art")
    with pytest.raises(ServeError, match="tool calls are read with openai .model type 'gpt_oss'., not 'hermes'"):
        chat_format_for("gpt_oss", None, server.engine.tokenizer, where="art", tool_call_parser="hermes")
    assert chat_format_for("gpt_oss", "openai_gptoss", server.engine.tokenizer, where="art",
                           tool_call_parser="openai")[1].startswith("chat format: harmony")
