"""gpt-oss's harmony format (runtime/openai/harmony.py, harmony_stream.py) held to openai-harmony itself: a request's
prompt is harmony's rendering of the messages vLLM builds from it, and harmony-encoded outputs, streamed in any
pieces, become vLLM's reasoning / content / tool calls."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuronpack.errors import InvalidRequestError, ServeError
from neuronpack.runtime.openai.chat_format import chat_message
from neuronpack.runtime.openai.harmony import HarmonyChat
from neuronpack.runtime.openai.harmony_stream import HarmonyChoice
from neuronpack.runtime.openai.schema import ChatCompletionRequest

CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"type": "function",
           "function": {"name": "get_weather", "description": "Weather in a city", "parameters": CITY}}
THINK_THEN_ANSWER = ("<|channel|>analysis<|message|>The user asks.<|end|><|start|>assistant<|channel|>final"
                     "<|message|>Paris<|return|>")
THINK_THEN_CALL = ("<|channel|>analysis<|message|>A<|end|><|start|>assistant<|channel|>commentary<|message|>Let me "
                   "check.<|end|><|start|>assistant<|channel|>analysis<|message|>B<|end|><|start|>assistant<|channel|>"
                   'commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>')


def request(messages, **fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "gpt-oss", "messages": messages, **fields})


def test_the_prompt_is_harmonys_rendering_of_the_request(harmony_encoding, monkeypatch):
    from openai_harmony import (
        Conversation,
        DeveloperContent,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
        ToolDescription,
    )

    monkeypatch.setenv("VLLM_SYSTEM_START_DATE", "2026-01-02")  # vLLM's pin of the start date
    body = request([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
                    {"role": "assistant", "content": "Paris.", "reasoning_content": "Easy."},
                    {"role": "user", "content": "And Spain?"}], reasoning_effort="low", tools=[WEATHER])
    tool = ToolDescription.new("get_weather", "Weather in a city", parameters=WEATHER["function"]["parameters"])
    expected = Conversation.from_messages([
        Message.from_role_and_content(Role.SYSTEM, SystemContent.new().with_reasoning_effort(ReasoningEffort.LOW)
                                      .with_conversation_start_date("2026-01-02")),
        Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_instructions("Be brief.")
                                      .with_function_tools([tool])),
        Message.from_role_and_content(Role.USER, "Capital of France?"),
        # the analysis before the last final answer is dropped
        Message.from_role_and_content(Role.ASSISTANT, "Paris.").with_channel("final"),
        Message.from_role_and_content(Role.USER, "And Spain?"),
    ])
    ours = HarmonyChat(harmony_encoding).render(body, body.tool_plan())
    assert ours == harmony_encoding.render_conversation_for_completion(expected, Role.ASSISTANT)
    assert harmony_encoding.decode_utf8(ours).endswith("<|start|>assistant")


def test_tool_calls_and_results_in_the_history_are_commentary_messages(harmony_encoding):
    from openai_harmony import Author, Conversation, Message, Role

    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    body = request([{"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": None, "reasoning": "Need a tool.", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], tools=[WEATHER])
    prompt = harmony_encoding.decode_utf8(HarmonyChat(harmony_encoding).render(body, body.tool_plan()))
    expected = Conversation.from_messages([
        Message.from_role_and_content(Role.ASSISTANT, "Need a tool.").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, '{"city":"Paris"}').with_channel("commentary")
        .with_recipient("functions.get_weather").with_content_type("json"),
        Message.from_author_and_content(Author.new(Role.TOOL, "functions.get_weather"), "sunny")
        .with_channel("commentary").with_recipient("assistant"),
    ])
    tail = harmony_encoding.decode_utf8(harmony_encoding.render_conversation_for_completion(expected, Role.ASSISTANT))
    assert prompt.endswith(tail)


def test_what_harmony_cannot_take_is_refused(harmony_encoding):
    chat = HarmonyChat(harmony_encoding)
    with pytest.raises(InvalidRequestError, match="reasoning_effort='max' is not supported by Harmony"):
        body = request([{"role": "user", "content": "Hi"}], reasoning_effort="max")
        chat.render(body, None)
    body = request([{"role": "user", "content": "Hi"}], tools=[WEATHER], tool_choice="required")
    with pytest.raises(InvalidRequestError, match="not supported with harmony"):
        chat.prepare(None, body, body.tool_plan())


class _Step:
    """What the engine hands a choice after a step: token ids (and their text)."""

    def __init__(self, token_ids, text: str = "") -> None:
        self.token_ids, self.text = list(token_ids), text


def parsed(encoding, text: str, cuts=(), *, include_reasoning: bool = True):
    """(message without tool-call ids, finish_reason, deltas) of a harmony output fed in pieces cut at ``cuts``."""
    ids = encoding.encode(text, allowed_special="all")
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(ids)), len(ids)]
    choice = HarmonyChoice(encoding, include_reasoning=include_reasoning)
    deltas = [d for a, b in zip(bounds, bounds[1:], strict=False) for d in choice.feed(_Step(ids[a:b]))]
    last, finish_reason = choice.finish("stop")
    message = chat_message([*deltas, *last], reasoning=True)
    for call in message.get("tool_calls", ()):
        assert call.pop("id").startswith("call_")
    return message, finish_reason, deltas


def test_channels_become_reasoning_content_and_tool_calls(harmony_encoding):
    message, finish_reason, _ = parsed(harmony_encoding, THINK_THEN_ANSWER)
    assert (message["reasoning_content"], message["content"], finish_reason) == ("The user asks.", "Paris", "stop")
    message, finish_reason, deltas = parsed(harmony_encoding, THINK_THEN_CALL)
    assert message["reasoning_content"] == message["reasoning"] == "A\nB"  # messages joined as vLLM joins them
    assert message["content"] == "Let me check." and finish_reason == "tool_calls"
    assert message["tool_calls"] == [{"type": "function",
                                      "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]
    opening = next(d["tool_calls"][0] for d in deltas if "tool_calls" in d)  # streamed as vLLM streams it
    assert opening["index"] == 0 and opening["function"] == {"name": "get_weather", "arguments": ""}
    assert parsed(harmony_encoding, THINK_THEN_ANSWER, include_reasoning=False)[0]["reasoning_content"] is None


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([THINK_THEN_ANSWER, THINK_THEN_CALL]), st.lists(st.integers(0, 40), max_size=10))
def test_any_stream_of_an_output_gives_its_message(harmony_encoding, text, cuts):
    assert parsed(harmony_encoding, text, cuts)[:2] == parsed(harmony_encoding, text)[:2]


def test_output_that_leaves_the_format_is_content(harmony_encoding):
    ids = harmony_encoding.encode("<|channel|>final<|message|>Hi<|end|>", allowed_special="all")
    choice = HarmonyChoice(harmony_encoding)
    assert choice.feed(_Step(ids)) == [{"content": "Hi"}]
    stray = harmony_encoding.encode("<|message|>", allowed_special="all")
    assert choice.feed(_Step(stray, "oops")) == [{"content": "oops"}]  # harmony refuses <|message|> here
    assert choice.feed(_Step([1, 2], " more")) == [{"content": " more"}]


def test_a_tokenizer_that_is_not_gpt_osss_is_refused(harmony_encodings, tokenizer_dir):
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    with pytest.raises(ServeError, match="it is not gpt-oss's o200k_harmony tokenizer"):
        HarmonyChat.load(ArtifactTokenizer.from_dir(tokenizer_dir))


@pytest.mark.parametrize("contents", [None, b"bm90IGl0 0\n"])  # no file; a file harmony's sha256 check refuses
def test_a_missing_or_wrong_vocabulary_says_where_to_put_it(harmony_encodings, tmp_path, monkeypatch, contents):
    import os
    import subprocess
    import sys

    if contents is not None:
        (tmp_path / "o200k_base.tiktoken").write_bytes(contents)
    code = ("from neuronpack.runtime.openai.harmony import load_encoding\nfrom neuronpack.errors import ServeError\n"
            "try:\n    load_encoding()\nexcept ServeError as e:\n    print(e.one_line())\n")
    env = {**os.environ, "TIKTOKEN_ENCODINGS_BASE": str(tmp_path)}  # a fresh process: harmony loads it anew
    line = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert "harmony could not load its vocabulary o200k_base" in line and str(tmp_path) in line
    assert "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d" in line
