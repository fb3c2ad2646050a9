"""`neuronpack convert-eagle` through typer's CliRunner: stdout carries the result, stderr the report and errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from neuronpack.cli.app import app
from tests.convert.eagle_fixtures import load_output, make_eagle1_draft, make_eagle3_draft, tiny_target, vocab_of


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    return CliRunner()


@pytest.fixture(scope="session")
def target(tmp_path_factory):
    base = tmp_path_factory.getbasetemp() / "eagle-targets"
    return lambda kind: tiny_target(base, kind)


def test_text_output_ends_with_the_out_path_and_reports_the_cast(tmp_path, runner, target):
    tgt = target("fp32")
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt))
    result = runner.invoke(app, ["convert-eagle", "--draft", str(draft), "--target", str(tgt),
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str((tmp_path / "out").absolute())
    assert "cast lm_head.weight F32 -> F16" in result.stderr
    assert "eagle1 draft converted: added lm_head.weight" in result.stderr
    assert "lm_head.weight" in load_output(tmp_path / "out")


def test_json_output_is_one_object(tmp_path, runner, target):
    tgt = target("bf16-sharded")
    draft = make_eagle3_draft(tmp_path / "draft", vocab=vocab_of(tgt))
    result = runner.invoke(app, ["convert-eagle", "--draft", str(draft), "--target", str(tgt),
                                 "--out", str(tmp_path / "out"), "--dtype", "bfloat16", "--format", "json", "-q"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["layout"] == "eagle3" and payload["nxd_hints"]["is_eagle3"] is True
    assert payload["added"][0]["name"] == "embed_tokens.weight" and payload["casts"] == []
    assert "layers.0.self_attn.q_proj.weight" in payload["renamed"].values()


def test_bad_input_is_one_error_line_and_exit_1(tmp_path, runner, target):
    tgt = target("fp32")
    draft = make_eagle1_draft(tmp_path / "draft", vocab=vocab_of(tgt), head=True)
    result = runner.invoke(app, ["convert-eagle", "--draft", str(draft), "--target", str(tgt),
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the EAGLE-1/2 draft already has lm_head.weight")
    assert not (tmp_path / "out").exists()


def test_unknown_dtype_is_a_usage_error(tmp_path, runner):
    result = runner.invoke(app, ["convert-eagle", "--draft", "a", "--target", "b", "--out", str(tmp_path / "o"),
                                 "--dtype", "int8"])
    assert result.exit_code == 2
