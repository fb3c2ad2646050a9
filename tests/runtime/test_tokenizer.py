"""The artifact tokenizer against transformers: same ids, same text, same chat prompt."""

import shutil

import pytest
from transformers import AutoTokenizer

from neuronpack.errors import InvalidRequestError, ServeError, TokenizerError
from neuronpack.runtime.tokenizer import ArtifactTokenizer

TEXTS = ["Hello world! How are you today?", "héllo wörld 你好 😀", "<|im_start|>user\nhi<|im_end|>", ""]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "The quick brown fox?"},
    {"role": "assistant", "content": "Jumps."},
    {"role": "user", "content": "And the dog?"},
]


@pytest.fixture(scope="module")
def both(tokenizer_dir):
    return ArtifactTokenizer.from_dir(tokenizer_dir), AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(both, text):
    ours, hf = both
    ids = ours.encode(text)
    assert ids == hf.encode(text)
    assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_chat_template_matches_apply_chat_template(both):
    ours, hf = both
    expected = hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert ours.apply_chat_template(MESSAGES) == expected
    assert ours.encode_chat(MESSAGES) == hf.encode(expected, add_special_tokens=False)
    assert ours.eos_token_id == hf.eos_token_id


def test_missing_tokenizer_and_template_are_clear_errors(tokenizer_dir, tmp_path):
    with pytest.raises(ServeError, match="no tokenizer.json") as exc:
        ArtifactTokenizer.from_dir(tmp_path)
    assert exc.value.where == str(tmp_path) and exc.value.fix
    no_template = tmp_path / "no-template"
    shutil.copytree(tokenizer_dir, no_template)
    (no_template / "chat_template.jinja").unlink()
    tok = ArtifactTokenizer.from_dir(no_template)
    with pytest.raises(ServeError, match="no chat template"):
        tok.apply_chat_template(MESSAGES)


def test_request_errors_and_server_faults_are_told_apart(tokenizer_dir, tmp_path):
    """What the client can fix is an InvalidRequestError (HTTP 400); a broken tokenizer or template is the server's
    fault, a TokenizerError (HTTP 500)."""
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        ArtifactTokenizer.from_dir(tmp_path)
    no_template = tmp_path / "no-template"
    shutil.copytree(tokenizer_dir, no_template)
    (no_template / "chat_template.jinja").unlink()
    with pytest.raises(InvalidRequestError, match="no chat template") as info:
        ArtifactTokenizer.from_dir(no_template).apply_chat_template(MESSAGES)
    assert info.value.param == "messages"
    cases = [("{{ raise_exception('roles must alternate') }}", InvalidRequestError, "roles must alternate"),
             ("{% if %}", TokenizerError, "the chat template is broken"),
             ("{{ 1 // 0 }}", TokenizerError, "ZeroDivisionError")]
    for template, error, message in cases:
        (no_template / "chat_template.jinja").write_text(template)
        with pytest.raises(error, match=message):
            ArtifactTokenizer.from_dir(no_template).apply_chat_template(MESSAGES)


def test_template_kwargs_reach_only_the_variables_a_template_reads(tokenizer_dir):
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    tok = ArtifactTokenizer.from_dir(tokenizer_dir)
    tok.chat_template = ("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
                         "{% if enable_thinking is defined and enable_thinking is false %}/no_think{% endif %}")
    assert tok.template_variables({"enable_thinking": False, "unknown": 1, "messages": []}) == \
        {"enable_thinking": False}
    messages = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(messages, template_kwargs={"enable_thinking": False}) == "Hi/no_think"
    assert tok.apply_chat_template(messages, template_kwargs={"unknown": 1}) == "Hi"
