"""Tool calling: OpenAI's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` fields, the grammar that enforces a
``required`` or named choice, the prompt the model sees, and the model's tool-call format (Hermes-style
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, as Qwen2.5, Hermes and vLLM's hermes parser use).

- ``none`` (or no tools): plain text.
- ``auto``: free text; ``<tool_call>`` blocks naming a declared function become ``tool_calls`` (``tool_stream.py``
  parses them, streamed or not) and the choice ends with finish_reason "tool_calls".
- ``required``: the grammar forces a JSON array of one or more ``{"name": <declared>, "arguments": <its schema>}``
  (exactly one when ``parallel_tool_calls`` is false); finish_reason "tool_calls".
- a named function: the grammar forces that function's arguments; finish_reason "stop", as OpenAI sends for a forced
  function.

Templates that render ``tools`` themselves get them; for one that does not (the model was not trained with a tool
format of its own), the Hermes instructions go into the system message, and assistant ``tool_calls`` in the history
are rendered as ``<tool_call>`` text so the model sees the format it is asked to write.

Example::

    plan = ToolPlan.of(body.tools, body.tool_choice, body.parallel_tool_calls)
    plan.grammar()           # GrammarSpec for required / named, None for auto
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from neuronpack.errors import InvalidRequestError
from neuronpack.runtime.structured.grammar import GrammarSpec

ToolMode = Literal["none", "auto", "required", "named"]
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class _FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: _FunctionName


class ToolFields(BaseModel):
    """The tool fields of a chat request."""

    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def tool_plan(self) -> ToolPlan | None:
        return ToolPlan.of(self.tools, self.tool_choice, self.parallel_tool_calls)


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tool fields ask for: the mode, the declared functions, the forced one, parallel calls."""

    mode: ToolMode
    functions: tuple[FunctionDef, ...]
    named: str | None = None
    parallel: bool = True

    @classmethod
    def of(cls, tools: list[ToolDef] | None, choice: Any, parallel: bool | None) -> ToolPlan | None:
        """None when no tool is declared (or ``tool_choice`` is "none"). InvalidRequestError for a choice that
        needs tools without any, or a named function that is not declared."""
        functions = tuple(t.function for t in tools or ())
        if isinstance(choice, NamedToolChoice):
            names = [f.name for f in functions]
            if choice.function.name not in names:
                raise InvalidRequestError(
                    f"tool_choice names the function {choice.function.name!r}, which tools does not declare "
                    f"(declared: {', '.join(names) or 'none'})", param="tool_choice")
            return cls("named", functions, choice.function.name, parallel is not False)
        if choice in ("required", "auto") and not functions:
            raise InvalidRequestError(f"tool_choice {choice!r} needs at least one function in tools",
                                      param="tool_choice")
        if not functions or choice == "none":
            return None
        return cls(choice or "auto", functions, None, parallel is not False)

    def grammar(self) -> GrammarSpec | None:
        """The grammar enforcing a required or named choice (None for auto: the model chooses freely)."""
        if self.mode == "named":
            return GrammarSpec.json_schema(self.function(self.named).parameters or ANY_OBJECT, param="tools")
        if self.mode != "required":
            return None
        calls = [{"type": "object", "properties": {"name": {"const": f.name}, "arguments": f.parameters or ANY_OBJECT},
                  "required": ["name", "arguments"], "additionalProperties": False} for f in self.functions]
        array: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if not self.parallel:
            array["maxItems"] = 1
        return GrammarSpec.json_schema(array, param="tools")

    def function(self, name: str | None) -> FunctionDef:
        return next(f for f in self.functions if f.name == name)

    def declares(self, name: Any) -> bool:
        return any(f.name == name for f in self.functions)

    def template_tools(self) -> list[dict[str, Any]]:
        """The tools as chat templates take them (OpenAI's shape)."""
        return [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in self.functions]

    def prompt_messages(self, messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
        """``messages`` for a template that does not render ``tools``: the Hermes instructions in the system message
        (a template that does gets ``template_tools()`` instead and the messages unchanged)."""
        if "tools" in template:
            return messages
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in self.template_tools())
        instructions = (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listing}\n</tools>"
            "\n\nFor each function call, return a json object with function name and arguments within "
            '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
            "<args-json-object>}\n</tool_call>")
        if messages and messages[0].get("role") == "system":
            first = {**messages[0], "content": f"{messages[0].get('content') or ''}\n\n{instructions}".strip()}
            return [first, *messages[1:]]
        return [{"role": "system", "content": instructions}, *messages]


def history_messages(messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """Past assistant ``tool_calls`` as templates take them: arguments parsed into objects (as vLLM passes them), or
    for a template that does not render ``tool_calls``, written into the content as ``<tool_call>`` text."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if not calls:
            out.append(message)
            continue
        parsed = [{**c, "function": {**c.get("function", {}), "arguments": _arguments(c, i)}}
                  for i, c in enumerate(calls)]
        if "tool_calls" in template:
            out.append({**message, "tool_calls": parsed})
            continue
        text = "\n".join(hermes_call(c["function"]["name"], c["function"]["arguments"]) for c in parsed)
        content = f"{message.get('content') or ''}\n{text}".strip()
        out.append({k: v for k, v in message.items() if k != "tool_calls"} | {"content": content})
    return out


def hermes_call(name: str, arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n</tool_call>"


def tool_call(name: str, arguments: str) -> dict[str, Any]:
    """One entry of a message's ``tool_calls`` (``arguments``: the JSON text)."""
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _arguments(call: dict[str, Any], index: int) -> Any:
    arguments = call.get("function", {}).get("arguments", {})
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        raise InvalidRequestError(f"the arguments of tool call {index} are not valid JSON",
                                  param="messages.tool_calls.function.arguments") from None
