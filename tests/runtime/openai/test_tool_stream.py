"""Tool calls read from a model's text: Hermes blocks in auto mode, the forced array of required, the forced
arguments of a named choice; streamed in any split, the deltas add up to the non-streamed message."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuronpack.errors import InvalidRequestError
from neuronpack.runtime.openai.tool_stream import ToolCallStream, parse_message
from neuronpack.runtime.openai.tools import NamedToolChoice, ToolDef, ToolPlan, history_messages

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [ToolDef.model_validate(WEATHER), ToolDef.model_validate(TIME)]
AUTO_TEXT = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')


def plan(choice="auto", parallel=None) -> ToolPlan:
    if isinstance(choice, dict):
        choice = NamedToolChoice.model_validate(choice)
    return ToolPlan.of(TOOLS, choice, parallel)


def streamed(p: ToolPlan, pieces: list[str], finish: str = "stop"):
    stream = ToolCallStream(p)
    deltas = [d for piece in pieces for d in stream.feed(piece)]
    last, reason = stream.finish(finish)
    return [*deltas, *last], reason


def test_auto_parses_hermes_blocks_and_keeps_the_rest_as_content():
    message, reason = parse_message(plan(), AUTO_TEXT, "stop")
    assert reason == "tool_calls" and message["content"] == "Let me check."
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"


def test_auto_without_a_valid_call_is_plain_content():
    for text in ("Hello <tool", '<tool_call>{"name": "undeclared", "arguments": {}}</tool_call>',
                 "<tool_call>not json</tool_call>"):
        message, reason = parse_message(plan(), text, "stop")
        assert (message, reason) == ({"role": "assistant", "content": text}, "stop")


def test_parallel_tool_calls_false_keeps_the_first_call():
    message, reason = parse_message(plan(parallel=False), AUTO_TEXT, "stop")
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"] and reason == "tool_calls"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(AUTO_TEXT)), max_size=12))
def test_any_split_of_the_stream_gives_the_same_calls(cuts):
    bounds = [0, *sorted(cuts), len(AUTO_TEXT)]
    deltas, reason = streamed(plan(), [AUTO_TEXT[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])
    content = "".join(d.get("content", "") for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", ())]
    assert content.strip() == "Let me check." and reason == "tool_calls"
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "get_weather"), (1, "get_time")]
    assert all("<" not in d.get("content", "") for d in deltas)  # a tag is never leaked as content


def test_required_reads_the_forced_array_and_named_streams_the_arguments():
    text = '[{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"get_time","arguments":{}}]'
    message, reason = parse_message(plan("required"), text, "stop")
    assert reason == "tool_calls" and message["content"] is None and len(message["tool_calls"]) == 2
    cut, cut_reason = parse_message(plan("required"), text[:20], "length")
    assert cut_reason == "length" and cut["content"] == text[:20] and "tool_calls" not in cut
    named = plan({"type": "function", "function": {"name": "get_weather"}})
    deltas, reason = streamed(named, ['{"ci', 'ty":"Oslo"}'])
    assert reason == "stop"  # OpenAI's finish_reason for a forced function
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"ci'}
    assert deltas[1] == {"tool_calls": [{"index": 0, "function": {"arguments": 'ty":"Oslo"}'}}]}


def test_grammars_of_required_and_named_choices():
    required = json.loads(plan("required", parallel=False).grammar().source)
    assert required["minItems"] == required["maxItems"] == 1
    assert [c["properties"]["name"]["const"] for c in required["items"]["anyOf"]] == ["get_weather", "get_time"]
    named = plan({"type": "function", "function": {"name": "get_weather"}}).grammar()
    assert json.loads(named.source) == WEATHER["function"]["parameters"] and plan("auto").grammar() is None


def test_a_named_tool_that_is_not_declared_is_refused():
    with pytest.raises(InvalidRequestError, match="does not declare") as exc:
        plan({"type": "function", "function": {"name": "nope"}})
    assert exc.value.param == "tool_choice"
    with pytest.raises(InvalidRequestError, match="needs at least one function"):
        ToolPlan.of([], "required", None)


def test_history_tool_calls_are_rendered_for_templates_without_tool_support():
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    plain = history_messages(messages, "{{ message['content'] }}")
    assert plain[1] == {"role": "assistant", "content":
                        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'}
    aware = history_messages(messages, "{% for c in message.tool_calls %}{% endfor %}")
    assert aware[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}  # parsed, as vLLM passes it
    with_tools = plan().prompt_messages(messages, "no tool support")
    assert with_tools[0]["role"] == "system" and '"name": "get_weather"' in with_tools[0]["content"]
    assert plan().prompt_messages(messages, "{{ tools }}") == messages
