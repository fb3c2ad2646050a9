"""The artifact's tokenizer and chat template, loaded from its files (``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja``) with the ``tokenizers`` library: no model code and no AutoTokenizer start-up cost.

Chat templates are rendered by transformers' own sandboxed renderer (``render_jinja_template``) with the same special
token variables ``apply_chat_template`` passes, so prompts match transformers exactly.

Example::

    tok = ArtifactTokenizer.from_dir(Path("neuron-compiled-artifacts/3f2a..."))
    ids = tok.encode("Hello")                                     # [..]
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    tok.decode(ids)                                               # "Hello"
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.errors import InvalidRequestError, TokenizerError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class ArtifactTokenizer:
    """Encode / decode / chat template for one artifact. Decoding skips special tokens (like vLLM's default)."""

    def __init__(
        self, tokenizer: Tokenizer, config: dict[str, Any], chat_template: str | None, where: str = "tokenizer"
    ) -> None:
        self._tok = tokenizer
        self.where = where
        self.chat_template = chat_template
        self.special_tokens = _special_tokens(config)
        self.clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        eos = self.special_tokens.get("eos_token")
        eos_id = tokenizer.token_to_id(eos) if eos else None
        self.eos_token_id: int | None = eos_id
        self._token_texts: dict[int, str] = {}

    @classmethod
    def from_dir(cls, path: Path) -> ArtifactTokenizer:
        """Load ``tokenizer.json`` (+ config and chat template) from an artifact or checkpoint directory.

        Example: ``ArtifactTokenizer.from_dir(artifact_dir).encode("Hi")``.
        """
        from tokenizers import Tokenizer

        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise TokenizerError(
                "the artifact has no tokenizer.json",
                where=str(path),
                fix="recompile from a checkpoint that ships a fast tokenizer (tokenizer.json)",
            )
        try:
            tokenizer = Tokenizer.from_file(str(tok_file))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise TokenizerError(f"cannot read tokenizer.json: {exc}", where=str(tok_file), fix="recompile") from None
        config = _read_json(path / "tokenizer_config.json")
        return cls(tokenizer, config, _chat_template(path, config), where=str(path))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (``add_special_tokens`` as in transformers: e.g. a BOS from the post-processor)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` without special tokens (same as transformers' ``decode(ids, skip_special_tokens=True)``)."""
        text = self._tok.decode(list(ids), skip_special_tokens=True)
        return _clean_up_tokenization(text) if self.clean_up_spaces else text

    def to_json_str(self) -> str:
        """The tokenizer as tokenizer.json text (what the grammar library builds its token trie from)."""
        return self._tok.to_str()

    def token_id(self, text: str) -> int | None:
        """The id of a token given by its text (an added token such as ``"</think>"``), or None when the vocabulary
        has no such single token."""
        return self._tok.token_to_id(text)

    def token_text(self, token_id: int) -> str:
        """One token's own text, special tokens included (how logprobs name tokens, like vLLM).

        Example: ``tok.token_text(tok.encode(" Paris")[0]) == " Paris"``.
        """
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self._tok.decode([token_id], skip_special_tokens=False)
        return text

    def apply_chat_template(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None,
                            template_kwargs: dict[str, Any] | None = None) -> str:
        """The prompt text for a conversation. InvalidRequestError (HTTP 400) when the model has no template or the
        template rejects the messages (``raise_exception`` in the template, wrong types); TokenizerError (HTTP 500)
        when the template itself is broken (syntax error, a failure inside it). ``template_kwargs``: more variables
        for the template (a request's ``chat_template_kwargs``, e.g. ``{"enable_thinking": False}``); those the
        template does not read are dropped, as vLLM drops them.

        Example: ``tok.apply_chat_template([{"role": "user", "content": "Hi"}])``
        -> ``"<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n"``.
        """
        if not self.chat_template:
            raise InvalidRequestError(
                "this model has no chat template",
                param="messages",
                where=self.where,
                fix="use /v1/completions, or compile from a checkpoint whose tokenizer has a chat_template",
            )
        from jinja2.exceptions import TemplateError, TemplateSyntaxError
        from transformers.utils.chat_template_utils import render_jinja_template

        try:
            rendered, _ = render_jinja_template(
                conversations=[messages],
                tools=tools,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
                **self.template_variables(template_kwargs or {}),
            )
        except TemplateSyntaxError as exc:
            raise TokenizerError(f"the chat template is broken: {exc}", where=self.where,
                                 fix="recompile from a checkpoint with a valid chat template") from None
        except (TemplateError, TypeError, ValueError) as exc:
            raise InvalidRequestError(f"the chat template rejected the messages: {exc}", param="messages",
                                      where="messages") from None
        except Exception as exc:  # a failure inside the template is the template's fault, not the request's
            raise TokenizerError(f"the chat template failed: {type(exc).__name__}: {exc}", where=self.where,
                                 fix="recompile from a checkpoint with a working chat template") from None
        return rendered[0]

    def encode_chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Prompt ids for a conversation (and the tools a template renders): the template already holds the special
        tokens, so none are added."""
        text = self.apply_chat_template(messages, tools=tools, template_kwargs=template_kwargs)
        return self.encode(text, add_special_tokens=False)

    def template_variables(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` restricted to the variables the chat template reads (vLLM's resolve_chat_template_kwargs keeps
        those and apply_chat_template's own parameters, which the renderer here sets itself)."""
        if not kwargs or not self.chat_template:
            return {}
        names = _template_variables(self.chat_template)
        return {k: v for k, v in kwargs.items() if k in names and k not in _RENDERER_PARAMETERS}


# What the renderer passes itself (render_jinja_template's parameters): a request's kwargs never replace them.
_RENDERER_PARAMETERS = frozenset({"messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
                                  "chat_template", "tokenize"})


@lru_cache(maxsize=8)
def _template_variables(template: str) -> frozenset[str]:
    """The variables a Jinja template reads from its context (a syntax error reads none: rendering reports it)."""
    import jinja2
    from jinja2 import meta
    from jinja2.ext import Extension, loopcontrols

    class Generation(Extension):  # transformers' {% generation %} blocks, parsed for their variables only
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    try:
        ast = jinja2.Environment(extensions=[Generation, loopcontrols]).parse(template)
    except jinja2.TemplateSyntaxError:
        return frozenset()
    return frozenset(meta.find_undeclared_variables(ast))


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"cannot read {path.name}: {exc}", where=str(path), fix="recompile the artifact") from None
    return data if isinstance(data, dict) else {}


def _special_tokens(config: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, dict):  # older files: {"content": "<s>", "lstrip": false, ...}
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def _chat_template(path: Path, config: dict[str, Any]) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _clean_up_tokenization(text: str) -> str:
    # transformers' clean_up_tokenization, for tokenizers whose config asks for it.
    for old, new in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                     (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(old, new)
    return text
