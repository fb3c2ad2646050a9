"""The reasoning parsers (runtime/openai/reasoning.py): vLLM's rules for qwen3 and deepseek_r1 on whole outputs, and
any stream of the same output (cut anywhere, tags included) giving the same message."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuronpack.errors import ServeError
from neuronpack.runtime.openai.chat_format import TemplateChoice, chat_message
from neuronpack.runtime.openai.reasoning import THINK_PARSERS, ThinkParser, ThinkSplit, check_reasoning_parser
from neuronpack.runtime.openai.tools import FunctionDef, ToolPlan

QWEN3, R1 = THINK_PARSERS["qwen3"], THINK_PARSERS["deepseek_r1"]


def split(text: str, *, tags=QWEN3, thinking: bool = True, cuts=()) -> tuple[str | None, str | None]:
    """(reasoning, content) of ``text`` fed in pieces cut at ``cuts``, as a non-streaming message says them."""
    parser = ThinkSplit(tags, thinking=thinking)
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(text)), len(text)]
    deltas = [d for a, b in zip(bounds, bounds[1:], strict=False) for d in parser.feed(text[a:b])] + parser.finish()
    message = chat_message(deltas, reasoning=True, had_reasoning=parser.had_reasoning)
    return message["reasoning_content"], message["content"]


@pytest.mark.parametrize(("text", "thinking", "expected"), [
    ("<think>Let me see</think>\n\nParis", True, ("Let me see", "\n\nParis")),  # the model opens the tag itself
    ("Let me see</think>Paris", True, ("Let me see", "Paris")),  # the template opened it (Qwen3-Thinking-2507)
    ("\n<think>Let me see</think>", True, ("Let me see", None)),  # nothing after the reasoning: content null
    ("<think>Let me", True, ("Let me", None)),  # cut by max_tokens while thinking: all reasoning
    ("</think>Paris", True, ("", "Paris")),  # an empty reasoning is "" (vLLM: the text before </think>)
    ("Paris", False, (None, "Paris")),  # enable_thinking false, or the prompt closed the reasoning
    ("Paris <think>not a tag here</think>", False, (None, "Paris <think>not a tag here</think>")),
])
def test_qwen3_outputs_split_as_vllm_splits_them(text, thinking, expected):
    assert split(text, thinking=thinking) == expected


def test_deepseek_r1_has_no_switch():
    assert split("<think>a</think>b", tags=R1) == ("a", "b")
    assert split("no end tag", tags=R1) == ("no end tag", None)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab<>/thinkP \n", max_size=40), st.lists(st.integers(0, 40), max_size=8), st.booleans())
def test_any_stream_of_an_output_gives_its_message(text, cuts, thinking):
    assert split(text, thinking=thinking, cuts=cuts) == split(text, thinking=thinking)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="xy \n", max_size=12), st.text(alphabet="xy \n", max_size=12), st.lists(st.integers(0, 60)))
def test_reasoning_and_content_come_back_whole_from_the_tags(reasoning, content, cuts):
    text = f"<think>{reasoning}</think>{content}"
    assert split(text, cuts=cuts) == (reasoning, content or None)


class _Step:
    def __init__(self, text: str) -> None:
        self.text, self.token_ids = text, []


def test_tool_calls_are_parsed_from_the_content_after_the_reasoning():
    plan = ToolPlan("auto", (FunctionDef(name="get_weather"),))
    text = '<think>I need the weather <tool_call> maybe</think>Sure.<tool_call>{"name": "get_weather", ' \
           '"arguments": {"city": "Paris"}}</tool_call>'
    for pieces in ([text], [text[i:i + 7] for i in range(0, len(text), 7)]):
        choice = TemplateChoice(plan, ThinkSplit(QWEN3, thinking=True))
        deltas = [d for p in pieces for d in choice.feed(_Step(p))]
        last, reason = choice.finish("stop")
        message = chat_message([*deltas, *last], reasoning=True, had_reasoning=choice.had_reasoning)
        assert reason == "tool_calls" and message["reasoning_content"] == "I need the weather <tool_call> maybe"
        assert message["content"] == "Sure."
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == \
            [("get_weather", '{"city": "Paris"}')]


def test_a_prompt_that_closed_the_reasoning_makes_the_output_content():
    parser = ThinkParser("qwen3", QWEN3, start_id=7, end_id=8)
    assert parser.prompt_ends_reasoning([1, 7, 5, 8, 5]) and not parser.prompt_ends_reasoning([1, 8, 7, 5])
    assert not parser.thinking({}, [1, 7, 8, 4]) and parser.thinking({}, [1, 2])
    assert not parser.thinking({"enable_thinking": False}, [1, 2])
    assert ThinkParser("deepseek_r1", R1, 7, 8).thinking({"enable_thinking": False}, [1, 2])  # no switch
    assert parser.gate(thinking=False).ended and parser.gate(thinking=True).end == (8,)


def test_unknown_and_unimplemented_names_are_refused_with_vllms_list():
    with pytest.raises(ServeError, match="not found. Available parsers: cohere_command3, .*, step3p5"):
        check_reasoning_parser("qwen")
    with pytest.raises(ServeError, match="implements qwen3, mimo, deepseek_r1, openai_gptoss only"):
        check_reasoning_parser("kimi_k2")
    with pytest.raises(ServeError, match="needs <think> and </think> as tokens") as err:
        ThinkParser.load("qwen3", {"<think>": 5}.get)
    assert "drop --reasoning-parser qwen3" in err.value.fix


def test_reasoning_fields_of_a_request():
    from neuronpack.errors import InvalidRequestError
    from neuronpack.runtime.openai.schema import ChatCompletionRequest

    def body(**fields):
        return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                                                     **fields})

    assert body(reasoning_effort="none").template_kwargs() == {"reasoning_effort": "none", "enable_thinking": False}
    kwargs = {"enable_thinking": True, "reasoning_effort": "low"}
    assert body(reasoning_effort="high", chat_template_kwargs=kwargs).template_kwargs() == \
        {"enable_thinking": True, "reasoning_effort": "high"}  # the top-level effort wins, the kwargs' switch stays
    with pytest.raises(InvalidRequestError, match="thinking_token_budget is not supported"):
        body(thinking_token_budget=64).refuse_unsupported()
    body(thinking_token_budget=None).refuse_unsupported()
