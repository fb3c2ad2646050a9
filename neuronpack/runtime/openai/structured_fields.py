"""The request fields that ask for structured output, as OpenAI and vLLM define them, turned into one GrammarSpec.

- ``response_format``: ``{"type": "text"}`` (nothing), ``{"type": "json_object"}`` (any JSON object) or
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` (what the openai client's
  ``chat.completions.parse(response_format=PydanticModel)`` sends);
- vLLM's ``structured_outputs`` (``{"json" | "regex" | "choice" | "grammar" | "json_object": ...}``) and its legacy
  ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar`` (EBNF / GBNF or Lark).

At most one of them may ask for a grammar (400 otherwise, naming both). ``structured_outputs.structural_tag`` is
refused by name.

Example::

    class Request(StructuredFields): ...
    Request.model_validate({"guided_regex": "[0-9]+"}).grammar_spec()   # GrammarSpec("regex", "[0-9]+")
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from neuronpack.errors import InvalidRequestError
from neuronpack.runtime.structured.grammar import GrammarSpec


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | StrictBool | None = Field(None, alias="schema")  # 0.0 is no schema (schemathesis)
    strict: StrictBool | None = None  # not lax: 0.0 is not a boolean (a schemathesis negative case)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs`` (its SamplingParams' StructuredOutputsParams)."""

    model_config = ConfigDict(extra="ignore")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: StrictBool | None = None
    structural_tag: str | None = None


class StructuredFields(BaseModel):
    """The structured-output fields of a completions or chat request."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def grammar_spec(self) -> GrammarSpec | None:
        """The grammar the fields ask for (None: free text). InvalidRequestError when two fields ask for one."""
        specs = [(param, spec) for param, spec in self._specs() if spec is not None]
        if len(specs) > 1:
            names = " and ".join(param for param, _ in specs)
            raise InvalidRequestError(f"{names} both constrain the output; give one of them", param=specs[1][0])
        return specs[0][1] if specs else None

    def _specs(self) -> list[tuple[str, GrammarSpec | None]]:
        out = [("response_format", _response_format(self.response_format)),
               *_kind_specs("guided_", self.guided_json, self.guided_regex, self.guided_choice, self.guided_grammar)]
        if (so := self.structured_outputs) is not None:
            if so.structural_tag is not None:
                raise InvalidRequestError("structured_outputs.structural_tag is not supported by this runtime",
                                          param="structured_outputs.structural_tag",
                                          fix="use json, regex, choice or grammar")
            out += _kind_specs("structured_outputs.", so.json_, so.regex, so.choice, so.grammar)
            if so.json_object:
                out.append(("structured_outputs.json_object",
                            GrammarSpec.json_object(param="structured_outputs.json_object")))
        return out


def _response_format(rf: ResponseFormat | None) -> GrammarSpec | None:
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return GrammarSpec.json_object(param="response_format")
    if rf.json_schema is None or rf.json_schema.json_schema is None:
        raise InvalidRequestError("response_format.json_schema.schema is missing (type json_schema needs a schema)",
                                  param="response_format.json_schema")
    return GrammarSpec.json_schema(rf.json_schema.json_schema, param="response_format.json_schema.schema")


def _kind_specs(prefix: str, schema: Any, regex: str | None, choice: list[str] | None, grammar: str | None
                ) -> list[tuple[str, GrammarSpec | None]]:
    """The specs of vLLM's four kinds, named ``prefix`` + json / regex / choice / grammar (its legacy ``guided_*``
    fields and its ``structured_outputs`` keys)."""
    out: list[tuple[str, GrammarSpec | None]] = []
    if schema is not None:
        out.append((f"{prefix}json", GrammarSpec.json_schema(schema, param=f"{prefix}json")))
    if regex is not None:
        out.append((f"{prefix}regex", GrammarSpec("regex", regex, f"{prefix}regex")))
    if choice is not None:
        out.append((f"{prefix}choice", GrammarSpec.choice(choice, param=f"{prefix}choice")))
    if grammar is not None:
        out.append((f"{prefix}grammar", GrammarSpec("grammar", grammar, f"{prefix}grammar")))
    return out
