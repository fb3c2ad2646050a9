"""`neuronpack eval` on Qwen3 and Gemma 3 artifacts against transformers: the shared AOTInductor artifacts (float32)
pass strictly (their serving path: one context pass, then decode steps past Gemma 3's window), and an int8 Gemma 3
build (quantized by the pipeline, export-only graphs) passes the int8 thresholds."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from neuronpack.cli.app import app
from neuronpack.pipeline import compile_model
from tests.cli.test_eval_cmd import FAST, RECIPE, TWO_PROMPTS

pytestmark = pytest.mark.slow
runner = CliRunner(env={"COLUMNS": "160"})


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in TWO_PROMPTS))
    return path


def evaluate(artifact, prompts_file) -> dict:
    out = runner.invoke(app, ["eval", str(artifact), "--format", "json", "--prompts", str(prompts_file),
                              "--max-new-tokens", "24"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_float32_family_artifacts_pass_strictly(family_artifact, prompts_file, name):
    report = evaluate(family_artifact(name).path, prompts_file)
    summary = report["summary"]
    assert report["status"] == "passed" and report["precision"] == "float32"
    assert summary["top1_agreement"] == 1.0 and summary["greedy_full_matches"] == 2 and summary["kl_max"] < 1e-8


def test_int8_gemma3_build_passes_its_thresholds(family_artifact, tmp_path, prompts_file):
    checkpoint = family_artifact("gemma3").checkpoint
    built = compile_model(str(checkpoint), recipe=RECIPE, overrides=[*FAST, 'quantization.dtype="int8"'],
                          out_root=tmp_path)
    report = evaluate(built.path, prompts_file)
    assert report["precision"] == "int8" and report["status"] == "passed"
    assert report["reference"] == str(checkpoint)
    assert 0 < report["summary"]["kl_mean"] <= report["thresholds"]["max_kl_mean"]
