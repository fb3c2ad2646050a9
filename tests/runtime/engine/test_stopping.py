"""Stop rules and incremental detokenization with the real tiny tokenizer."""

import pytest

from neuronpack.runtime.engine.stopping import IncrementalDetokenizer, SequenceOutput, StopRules
from neuronpack.runtime.tokenizer import ArtifactTokenizer


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return ArtifactTokenizer.from_dir(tokenizer_dir)


def run(tok, text, *, prompt="Say:", **rules):
    """Feed the tokens of ``text`` one by one; return (deltas, tracker)."""
    rules.setdefault("eos_token_ids", frozenset({tok.eos_token_id}))
    rules.setdefault("max_tokens", 1000)
    rules.setdefault("max_model_len", 10_000)
    prompt_ids = tok.encode(prompt)
    out = SequenceOutput(StopRules(**rules), prompt_ids, IncrementalDetokenizer(tok, prompt_ids))
    deltas = []
    ids = tok.encode(text, add_special_tokens=False) if isinstance(text, str) else text
    for token in ids:
        delta = out.append(token)
        deltas.append(delta.text)
        if delta.finish_reason:
            break
    return deltas, out


@pytest.mark.parametrize("text", ["Hello world! How are you today?", "héllo wörld 你好 😀 ok", " leading space"])
def test_streamed_deltas_add_up_to_the_decoded_text(tok, text):
    deltas, out = run(tok, text)
    assert "".join(deltas) == tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert all("\ufffd" not in d for d in deltas)  # split characters are held back, never streamed broken
    assert out.finish_reason is None


def test_stop_string_is_trimmed_and_never_streamed(tok):
    deltas, out = run(tok, "Hello world! How are you today?", stop=("How are",))
    assert out.finish_reason == "stop"
    assert out.text == "Hello world! "
    assert "".join(deltas) == "Hello world! "
    assert len(out.token_ids) < len(tok.encode("Hello world! How are you today?", add_special_tokens=False))


def test_first_of_several_stop_strings_wins(tok):
    _, out = run(tok, "The quick brown fox jumps over the lazy dog.", stop=("lazy", "brown"))
    assert out.text == "The quick " and out.finish_reason == "stop"


def test_eos_stops_counts_and_adds_no_text(tok):
    ids = tok.encode("Hello world", add_special_tokens=False) + [tok.eos_token_id] + tok.encode("!")
    deltas, out = run(tok, ids)
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] == tok.eos_token_id and len(out.token_ids) == len(ids) - len(tok.encode("!"))
    assert "".join(deltas) == out.text == "Hello world"


def test_ignore_eos_and_stop_token_ids(tok):
    ids = tok.encode("Hello", add_special_tokens=False) + [tok.eos_token_id] + tok.encode(" world")
    _, out = run(tok, ids, ignore_eos=True)
    assert out.finish_reason is None and len(out.token_ids) == len(ids)
    world = tok.encode(" world", add_special_tokens=False)[0]
    _, out = run(tok, ids, ignore_eos=True, stop_token_ids=frozenset({world}))
    assert out.finish_reason == "stop" and out.token_ids[-1] == world


def test_max_tokens_and_max_model_len_end_with_length(tok):
    text = "The quick brown fox jumps over the lazy dog."
    _, out = run(tok, text, max_tokens=3)
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    prompt_len = len(tok.encode("Say:"))
    _, out = run(tok, text, max_model_len=prompt_len + 5)
    assert out.finish_reason == "length" and out.total_len == prompt_len + 5


@pytest.mark.parametrize("lookahead", [0, 1, 4])
def test_lookahead_finishes_early(tok, lookahead):
    """With speculation, L + lookahead > max_model_len must finish with "length" one iteration early."""
    prompt_len = len(tok.encode("Say:"))
    max_model_len = prompt_len + 10
    _, out = run(tok, "The quick brown fox jumps over the lazy dog. " * 3, max_model_len=max_model_len,
                 lookahead=lookahead)
    assert out.finish_reason == "length"
    expected = max_model_len if lookahead == 0 else max_model_len - lookahead + 1  # first L with L + k > max
    assert out.total_len == expected
    assert out.total_len + lookahead > max_model_len or out.total_len == max_model_len


def test_appending_after_finish_is_a_bug(tok):
    _, out = run(tok, "Hello world", max_tokens=1)
    with pytest.raises(RuntimeError):
        out.append(5)


def test_include_stop_str_in_output_keeps_it_and_holds_nothing_back(tok):
    deltas, out = run(tok, "Hello world! How are you today?", stop=("How are",), include_stop_str_in_output=True)
    assert out.text == "".join(deltas) == "Hello world! How are"
    assert (out.finish_reason, out.stop_reason) == ("stop", "How are")
    ids = tok.encode("Hello world! How", add_special_tokens=False)
    for include, expected in ((False, tok.decode(ids[:-1])), (True, tok.decode(ids))):
        _, out = run(tok, ids, stop_token_ids=frozenset({ids[-1]}), include_stop_str_in_output=include)
        assert (out.text, out.finish_reason, out.stop_reason) == (expected, "stop", ids[-1])
