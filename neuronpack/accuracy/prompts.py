"""The prompts an accuracy check runs: built-in defaults, or a JSONL file (one prompt per line).

A line is ``{"prompt": "text"}`` (encoded with the tokenizer's special tokens, like /v1/completions) or
``{"messages": [{"role": "user", "content": "..."}]}`` (the chat template with the generation prompt, like
/v1/chat/completions); an optional ``"name"`` labels it in the report.

Example::

    prompts = load_prompts(Path("prompts.jsonl"))         # or DEFAULT_PROMPTS
    ids = encode_prompt(prompts[0], tokenizer)             # token ids
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.errors import AccuracyError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class EvalPrompt:
    name: str
    text: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None


# Short and varied (prose, code, arithmetic, a list, another language, chat), so every prompt fits small context
# buckets and each exercises different parts of the vocabulary.
DEFAULT_PROMPTS: tuple[EvalPrompt, ...] = (
    EvalPrompt("prose", text="The history of the printing press begins in"),
    EvalPrompt("code", text="def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    EvalPrompt("arithmetic", text="Question: what is 17 times 23? Answer:"),
    EvalPrompt("list", text="Three tips for a good night's sleep:\n1."),
    EvalPrompt("french", text="La capitale de la France est"),
    EvalPrompt("chat", messages=({"role": "user", "content": "What is the capital of France?"},)),
)


def load_prompts(path: Path) -> tuple[EvalPrompt, ...]:
    """Prompts from a JSONL file; AccuracyError naming the line for anything malformed."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise AccuracyError(f"cannot read the prompts file: {exc}", where=str(path),
                            fix="pass a UTF-8 JSONL file with one {\"prompt\": ...} per line") from None
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        prompts.append(_parse_line(line, f"{path}:{number}", len(prompts)))
    if not prompts:
        raise AccuracyError("the prompts file has no prompts", where=str(path),
                            fix="add one JSON object per line, e.g. {\"prompt\": \"Hello\"}")
    return tuple(prompts)


def _parse_line(line: str, where: str, index: int) -> EvalPrompt:
    fix = 'each line must be {"prompt": "text"} or {"messages": [{"role": "user", "content": "text"}]}'
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise AccuracyError(f"not valid JSON: {exc}", where=where, fix=fix) from None
    if not isinstance(data, dict):
        raise AccuracyError("a line is not a JSON object", where=where, fix=fix)
    name = str(data.get("name") or f"prompt-{index + 1}")
    text, messages = data.get("prompt"), data.get("messages")
    if isinstance(text, str) and text and messages is None:
        return EvalPrompt(name, text=text)
    if isinstance(messages, list) and messages and text is None and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        return EvalPrompt(name, messages=tuple(messages))
    raise AccuracyError("a line needs exactly one of a non-empty \"prompt\" string or \"messages\" list", where=where,
                        fix=fix)


def encode_prompt(prompt: EvalPrompt, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids of a prompt (the artifact's tokenizer files through transformers), encoded the way the server does:
    text with the tokenizer's special tokens (/v1/completions), messages through the chat template with the
    generation prompt (/v1/chat/completions); AccuracyError when the template is missing or rejects them."""
    if prompt.messages is None:
        return list(tokenizer(prompt.text or "")["input_ids"])
    if not tokenizer.chat_template:
        raise AccuracyError(f"prompt {prompt.name!r} has messages but the tokenizer has no chat template",
                            where=prompt.name, fix='give it as {"prompt": "text"}')
    try:
        encoded = tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True, tokenize=True,
                                                return_dict=True)
    except Exception as exc:  # jinja2 template errors surface as several exception types
        raise AccuracyError(f"the chat template rejected prompt {prompt.name!r}: {exc}", where=prompt.name,
                            fix="check its roles and contents") from None
    return list(encoded["input_ids"])
