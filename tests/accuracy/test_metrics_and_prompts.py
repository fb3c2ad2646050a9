"""The accuracy figures on hand-made logits (values computable by hand), the thresholds' verdicts, and prompt files."""

from __future__ import annotations

import math

import pytest
import torch

from neuronpack.accuracy import THRESHOLDS, load_prompts
from neuronpack.accuracy.metrics import compare_logits, precision_class, summarize
from neuronpack.errors import AccuracyError


def test_identical_logits_agree_completely():
    logits = torch.randn(7, 11, generator=torch.Generator().manual_seed(0))
    continuation = logits[3:].argmax(-1).tolist()  # prompt of 4: rows 3.. choose the continuation
    stats = compare_logits(logits, logits.clone(), continuation, prompt_len=4)
    assert (stats.top1_agreement, stats.max_abs_diff, stats.kl_max) == (1.0, 0.0, 0.0)
    assert stats.greedy_match == len(continuation) == 4 and stats.positions == 7


def test_figures_of_a_known_difference():
    reference = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
    artifact = torch.tensor([[2.0, 0.0], [2.0, 0.0], [1.0, 0.5]])  # row 1 flips its argmax
    stats = compare_logits(reference, artifact, [1, 0], prompt_len=2)
    assert stats.top1_agreement == pytest.approx(2 / 3)
    assert stats.max_abs_diff == 2.0 and stats.mean_abs_diff == pytest.approx(4.5 / 6)
    p = torch.softmax(torch.tensor([0.0, 2.0], dtype=torch.float64), -1)
    q = torch.softmax(torch.tensor([2.0, 0.0], dtype=torch.float64), -1)
    assert stats.kl_max == pytest.approx(float((p * (p / q).log()).sum()))
    assert stats.greedy_match == 0  # row 1 (first continuation choice) picks 0, the reference chose 1


def test_summary_weights_by_positions_and_thresholds_judge_it():
    a = compare_logits(torch.zeros(3, 4), torch.zeros(3, 4), [0], prompt_len=3, name="a")
    flipped = torch.zeros(1, 4)
    flipped[0, 2] = 5.0
    b = compare_logits(torch.zeros(1, 4), flipped, [0], prompt_len=1, name="b")
    summary = summarize([a, b])
    assert summary["top1_agreement"] == pytest.approx(3 / 4) and summary["positions"] == 4
    assert summary["greedy_match_min"] == 0 and summary["greedy_full_matches"] == 1
    failures = THRESHOLDS["float32"].failures(summary)
    assert any(f.startswith("top-1 agreement 0.7500 < 1.0") for f in failures)
    assert any("greedy continuation diverged" in f for f in failures)
    assert THRESHOLDS["float32"].failures(summarize([a])) == []
    assert math.isclose(summary["max_abs_diff"], 5.0)


def test_precision_class():
    assert precision_class("bfloat16", None) == "bfloat16"
    assert precision_class("bfloat16", "int8") == "int8" and precision_class("float32", "fp8") == "fp8"
    assert set(THRESHOLDS) == {"float32", "bfloat16", "float16", "int8", "fp8"}


def test_prompts_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "Hello"}\n\n{"name": "c", "messages": [{"role": "user", "content": "Hi"}]}\n')
    first, second = load_prompts(path)
    assert (first.name, first.text) == ("prompt-1", "Hello")
    assert second.name == "c" and second.messages == ({"role": "user", "content": "Hi"},)


@pytest.mark.parametrize(("content", "line", "what"), [
    ('{"prompt": "ok"}\nnot json\n', 2, "not valid JSON"),
    ('{"prompt": ""}\n', 1, "exactly one of"),
    ('{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}\n', 1, "exactly one of"),
    ('{"messages": [{"role": "user"}]}\n', 1, "exactly one of"),
    ('[1, 2]\n', 1, "not a JSON object"),
])
def test_bad_prompt_lines_name_the_line(tmp_path, content, line, what):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(AccuracyError, match=what) as info:
        load_prompts(path)
    assert info.value.where == f"{path}:{line}"


def test_empty_or_missing_prompts_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(AccuracyError, match="no prompts"):
        load_prompts(tmp_path / "empty.jsonl")
    with pytest.raises(AccuracyError, match="cannot read"):
        load_prompts(tmp_path / "missing.jsonl")
