"""What a request needs before it reaches the engine, done on the server's worker threads (never the event loop,
never the engine loop): the chat prompt with its tools (and ``chat_template_kwargs``) rendered through the chat
template, and the compiled grammar of its structured-output fields or of a forced tool choice
(``runtime/structured``).

Example::

    prompt_ids, grammar = chat_prompt(engine, body, body.tool_plan())
    grammar = request_grammar(engine, body.grammar_spec())        # /v1/completions
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuronpack.errors import InvalidRequestError
from neuronpack.runtime.openai.tools import ToolPlan, history_messages
from neuronpack.runtime.structured import CompiledGrammar, GrammarSpec

if TYPE_CHECKING:
    from neuronpack.runtime.engine import Engine
    from neuronpack.runtime.openai.schema import ChatCompletionRequest


def chat_prompt(engine: Engine, body: ChatCompletionRequest, plan: ToolPlan | None
                ) -> tuple[list[int], CompiledGrammar | None]:
    """The prompt token ids of a chat request and the grammar its output must match (None: free text)."""
    spec = body.grammar_spec()
    forced = plan.grammar() if plan is not None else None
    if spec is not None and forced is not None:
        raise InvalidRequestError(f"tool_choice {plan.named or plan.mode!r} already constrains the output; "
                                  f"{spec.param} cannot be combined with it", param=spec.param)
    grammar = request_grammar(engine, spec or forced)  # a bad schema is refused before the template runs
    template = engine.tokenizer.chat_template or ""
    messages = history_messages([m.as_template_dict() for m in body.messages], template)
    tools = None
    if plan is not None:
        if "tools" in template:
            tools = plan.template_tools()
        else:
            messages = plan.prompt_messages(messages, template)
    return engine.tokenizer.encode_chat(messages, tools=tools, template_kwargs=body.template_kwargs()), grammar


def request_grammar(engine: Engine, spec: GrammarSpec | None) -> CompiledGrammar | None:
    """``spec`` compiled (cached by the engine's compiler), or None."""
    return engine.grammars.compile(spec) if spec is not None else None
