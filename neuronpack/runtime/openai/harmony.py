"""gpt-oss's chat format, harmony, through the ``openai-harmony`` package as vLLM uses it (vLLM switches to it for
``model_type`` "gpt_oss" and sets the ``openai_gptoss`` reasoning parser itself; so does ``neuronpack serve``).

The prompt is harmony's rendering of: a system message (``reasoning_effort`` low / medium / high, the conversation's
start date: today, or ``VLLM_SYSTEM_START_DATE`` as in vLLM), a developer message with the instructions of a leading
system / developer message and the request's tools (harmony renders them as a TypeScript namespace ``functions``),
then the conversation (an assistant's ``reasoning_content`` as an analysis message, its tool calls as commentary
messages to ``functions.NAME``, tool results from ``functions.NAME``; the analysis before the last final answer
dropped). The output is read with harmony's ``StreamableParser`` (harmony_stream.py): the analysis channel into
``reasoning_content``, final into ``content``, commentary to ``functions.NAME`` into ``tool_calls``. Generation stops
on harmony's stop tokens (``<|return|>``, ``<|call|>``), and a structured output's grammar applies after
``<|start|>assistant<|channel|>final<|message|>`` (vLLM's GptOssReasoningParser).

harmony loads its vocabulary (``o200k_base.tiktoken``) on first use: downloaded and cached (``TIKTOKEN_RS_CACHE_DIR``),
or read from ``TIKTOKEN_ENCODINGS_BASE`` (a directory holding the file) where the machine is offline; harmony checks
its sha256 either way (docs/serve.md says where to get the file offline).

Example::

    chat = HarmonyChat.load(engine.tokenizer)
    prepared = chat.prepare(engine, body, body.tool_plan())     # harmony-rendered prompt ids, stop ids
"""

from __future__ import annotations

import datetime
import json
import os
from typing import TYPE_CHECKING, Any

from neuronpack.errors import InvalidRequestError, ServeError
from neuronpack.runtime.openai.chat_format import PreparedChat
from neuronpack.runtime.openai.chat_prompt import request_grammar
from neuronpack.runtime.openai.harmony_stream import HarmonyChoice
from neuronpack.runtime.structured import ReasoningGate

if TYPE_CHECKING:
    from openai_harmony import HarmonyEncoding, Message

    from neuronpack.runtime.engine import Engine
    from neuronpack.runtime.openai.schema import ChatCompletionRequest
    from neuronpack.runtime.openai.tools import ToolPlan

EFFORTS = ("high", "medium", "low")  # what harmony's system message takes (vLLM's REASONING_EFFORT)
FINAL_HEADER = "<|start|>assistant<|channel|>final<|message|>"  # the reasoning ends here (GptOssReasoningParser)
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# Special tokens whose ids the artifact's tokenizer must share with harmony's encoding (o200k_harmony).
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")


def load_encoding() -> HarmonyEncoding:
    """harmony's gpt-oss encoding. ServeError (with where to get its vocabulary) when it cannot be loaded."""
    try:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    except ImportError:
        raise ServeError("gpt-oss chats in harmony, and the openai-harmony package is not installed",
                         fix="pip install 'openai-harmony==0.0.8'") from None
    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as exc:  # harmony raises HarmonyError for a download or a file it cannot read
        raise ServeError(f"harmony could not load its vocabulary o200k_base: {exc}",
                         where=os.environ.get("TIKTOKEN_ENCODINGS_BASE", "TIKTOKEN_ENCODINGS_BASE (unset)"),
                         fix="on a machine without internet, set TIKTOKEN_ENCODINGS_BASE to a directory holding "
                             f"o200k_base.tiktoken (sha256 {O200K_SHA256}; docs/serve.md, gpt-oss)") from None


class HarmonyChat:
    """The harmony chat format (a ``ChatFormat``, chat_format.py)."""

    reasoning = True

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self.encoding = encoding
        self.stop_token_ids = tuple(encoding.stop_tokens_for_assistant_actions())
        self.final_header = tuple(encoding.encode(FINAL_HEADER, allowed_special="all"))

    @classmethod
    def load(cls, tokenizer: Any) -> HarmonyChat:
        """The format for an artifact whose tokenizer is ``tokenizer``: ServeError when its special tokens are not
        harmony's (the prompt ids and the parsed ids must mean the same tokens)."""
        encoding = load_encoding()
        for text in HARMONY_TOKENS:
            ours, theirs = tokenizer.token_id(text), encoding.encode(text, allowed_special="all")
            if [ours] != theirs:
                raise ServeError(f"the artifact's tokenizer has {text} at id {ours}, harmony at {theirs}: it is not "
                                 "gpt-oss's o200k_harmony tokenizer", where=getattr(tokenizer, "where", "tokenizer"),
                                 fix="compile from a gpt-oss checkpoint with its own tokenizer")
        return cls(encoding)

    def prepare(self, engine: Engine, body: ChatCompletionRequest, plan: ToolPlan | None) -> PreparedChat:
        if plan is not None and plan.mode != "auto":
            raise InvalidRequestError(f"tool_choice {plan.named or plan.mode!r} is not supported with harmony "
                                      "(gpt-oss): the model chooses its tool calls", param="tool_choice",
                                      fix='send tool_choice "auto" (or leave it out)')
        grammar = request_grammar(engine, body.grammar_spec())
        prompt_ids = self.render(body, plan)
        if grammar is not None:  # vLLM: include_reasoning false constrains from the first token
            gate = ReasoningGate.after_prompt(self.final_header, prompt_ids, ended=not body.include_reasoning)
            grammar = grammar.after(gate)
        return PreparedChat(prompt_ids, grammar, self.stop_token_ids, thinking=True)

    def choice(self, body: ChatCompletionRequest, plan: ToolPlan | None, prepared: PreparedChat) -> HarmonyChoice:
        return HarmonyChoice(self.encoding, include_reasoning=body.include_reasoning)

    def render(self, body: ChatCompletionRequest, plan: ToolPlan | None) -> list[int]:
        """The prompt ids of a chat request, rendered by harmony for the assistant's next message."""
        from openai_harmony import Conversation, Role

        messages = [m.as_template_dict() for m in body.messages]
        instructions = None
        if messages[0].get("role") in ("system", "developer"):
            instructions, messages = messages[0].get("content") or None, messages[1:]
        conversation = [*preamble(body.reasoning_effort, instructions, plan), *conversation_messages(messages)]
        return self.encoding.render_conversation_for_completion(Conversation.from_messages(conversation),
                                                                Role.ASSISTANT)


def preamble(effort: str | None, instructions: str | None, plan: ToolPlan | None) -> list[Message]:
    """The system message (effort, start date) and, with instructions or tools, the developer message."""
    from openai_harmony import DeveloperContent, Message, ReasoningEffort, Role, SystemContent, ToolDescription

    system = SystemContent.new()
    if effort is not None:
        if effort not in EFFORTS:
            raise InvalidRequestError(f"reasoning_effort={effort!r} is not supported by Harmony. Supported values "
                                      f"are: {', '.join(EFFORTS)}.", param="reasoning_effort")
        system = system.with_reasoning_effort(ReasoningEffort(effort.capitalize()))
    start = os.environ.get("VLLM_SYSTEM_START_DATE") or datetime.date.today().strftime("%Y-%m-%d")
    out = [Message.from_role_and_content(Role.SYSTEM, system.with_conversation_start_date(start))]
    if instructions or plan is not None:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions(instructions)
        if plan is not None:
            developer = developer.with_function_tools(
                [ToolDescription.new(f.name, f.description or "", parameters=f.parameters) for f in plan.functions])
        out.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    return out


def conversation_messages(messages: list[dict[str, Any]]) -> list[Message]:
    """Chat messages as harmony messages, the analysis before the last final answer dropped (vLLM's
    auto_drop_analysis_messages)."""
    names = {c.get("id"): c.get("function", {}).get("name") for m in messages for c in m.get("tool_calls") or ()}
    out = [h for m in messages for h in _harmony_message(m, names)]
    last_final = max((i for i, m in enumerate(out) if m.author.role.value == "assistant" and m.channel == "final"),
                     default=-1)
    return [m for i, m in enumerate(out) if not (i < last_final and m.channel == "analysis")]


def _harmony_message(message: dict[str, Any], call_names: dict[Any, Any]) -> list[Message]:
    from openai_harmony import Author, Message, Role

    role, content = message.get("role"), message.get("content") or ""
    if role == "tool":
        name = call_names.get(message.get("tool_call_id")) or ""
        author = Author.new(Role.TOOL, f"functions.{name}")
        return [Message.from_author_and_content(author, content).with_channel("commentary").with_recipient("assistant")]
    if role != "assistant":
        try:
            return [Message.from_role_and_content(Role(role), content)]
        except ValueError:
            raise InvalidRequestError(f"role {role!r} is not one harmony knows (system, developer, user, assistant, "
                                      "tool)", param="messages") from None
    out = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    calls = message.get("tool_calls") or []
    if calls and content:  # a preamble to the calls
        out.append(Message.from_role_and_content(Role.ASSISTANT, content).with_channel("commentary"))
    if reasoning:
        out.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
    for call in calls:
        function = call.get("function", {})
        arguments = function.get("arguments") or ""
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
        out.append(Message.from_role_and_content(Role.ASSISTANT, arguments).with_channel("commentary")
                   .with_recipient(f"functions.{function.get('name', '')}").with_content_type("json"))
    if content and not calls:
        out.append(Message.from_role_and_content(Role.ASSISTANT, content).with_channel("final"))
    return out
