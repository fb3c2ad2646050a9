"""`neuronpack eval` and `compile --check-accuracy` on tiny artifacts against transformers: fp32 passes strictly,
bf16 and int8 pass their thresholds, a corrupted weight fails with exit 1, Neuron artifacts exit 3 with a plan."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from neuronpack.cli.app import app
from neuronpack.pipeline import compile_model

pytestmark = pytest.mark.slow
RECIPE = Path(__file__).parents[2] / "recipes" / "tiny-test.toml"
FAST = ["compiler=export"]  # export-only graphs build in seconds; the scored path is the same runtime code
runner = CliRunner(env={"COLUMNS": "160"})
TWO_PROMPTS = [{"prompt": "The history of the printing press", "name": "prose"},
               {"messages": [{"role": "user", "content": "Name a colour."}], "name": "chat"}]


@pytest.fixture(scope="module")
def checked(tiny_llama, tmp_path_factory) -> dict:
    """A tiny fp32 artifact compiled with --check-accuracy through the CLI (its JSON result)."""
    root = tmp_path_factory.mktemp("eval")
    out = runner.invoke(app, ["compile", str(tiny_llama), "--recipe", str(RECIPE), "--set", *FAST, "--out-root",
                              str(root), "--check-accuracy", "--format", "json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in TWO_PROMPTS))
    return path


def evaluate(artifact: str | Path, *args: str):
    return runner.invoke(app, ["eval", str(artifact), "--format", "json", *args])


def test_compile_check_accuracy_records_the_figures_and_stays_verifiable(checked, tiny_llama):
    accuracy = checked["accuracy"]
    assert accuracy["status"] == "passed" and accuracy["recorded"] is True
    assert accuracy["precision"] == "float32" and accuracy["reference"] == str(tiny_llama)
    manifest = json.loads((Path(checked["path"]) / "neuronpack.json").read_text())
    assert manifest["accuracy"] == accuracy and "accuracy" in manifest["timings"]
    assert "accuracy" not in json.dumps(manifest["key_inputs"])  # results, not key inputs
    verified = runner.invoke(app, ["verify", checked["path"]])  # the file list still matches: nothing was added
    assert verified.exit_code == 0, verified.output
    shown = runner.invoke(app, ["inspect", checked["path"]])
    assert "passed (float32): top-1 1.0000" in shown.stdout

    hit = runner.invoke(app, ["compile", str(tiny_llama), "--recipe", str(RECIPE), "--set", *FAST, "--out-root",
                              str(Path(checked["path"]).parents[1]), "--check-accuracy"])
    assert hit.exit_code == 0, hit.output
    assert hit.stdout.strip() == checked["path"]  # stdout stays the path; the report goes to stderr
    assert "PASS (float32" in hit.stderr and "cache hit" in hit.stderr


def test_fp32_artifact_passes_strictly(checked, prompts_file):
    out = evaluate(checked["path"], "--max-new-tokens", "16")
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    summary = report["summary"]
    assert report["status"] == "passed" and summary["prompts"] == 6  # every built-in prompt (the tokenizer chats)
    assert summary["top1_agreement"] == 1.0 and summary["max_abs_diff"] < 1e-3 and summary["kl_max"] < 1e-8
    assert summary["greedy_full_matches"] == 6 and summary["continuation_tokens"] == 16
    text = runner.invoke(app, ["eval", checked["path"], "--prompts", str(prompts_file), "--max-new-tokens", "4"])
    assert text.exit_code == 0 and "PASS (float32 thresholds" in text.stdout and "chat" in text.stdout


@pytest.mark.parametrize(("precision", "overrides"), [
    ("bfloat16", ['model.dtype="bfloat16"']),
    ("int8", ['quantization.dtype="int8"']),
])
def test_lower_precisions_pass_their_thresholds(tiny_llama, tmp_path, prompts_file, precision, overrides):
    built = compile_model(str(tiny_llama), recipe=RECIPE, overrides=[*FAST, *overrides], out_root=tmp_path)
    out = evaluate(built.path, "--prompts", str(prompts_file), "--max-new-tokens", "16")
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["precision"] == precision and report["status"] == "passed"
    assert report["reference"] == str(tiny_llama)  # int8: the original checkpoint, not the quantized one
    assert 0 < report["summary"]["kl_mean"] <= report["thresholds"]["max_kl_mean"]
    assert [p["name"] for p in report["prompts"]] == ["prose", "chat"]


def test_a_corrupted_weight_fails_with_exit_1(checked, tmp_path, prompts_file):
    artifact = tmp_path / "corrupted"
    shutil.copytree(checked["path"], artifact)
    weights = artifact / "weights" / "model.safetensors"
    tensors = load_file(weights)
    tensors["model.layers.1.mlp.down_proj.weight"] = tensors["model.layers.1.mlp.down_proj.weight"] * 1.05
    save_file(tensors, weights, metadata={"format": "pt"})
    out = evaluate(artifact, "--prompts", str(prompts_file), "--max-new-tokens", "8")
    assert out.exit_code == 1, out.output
    report = json.loads(out.stdout)
    assert report["status"] == "failed" and report["failures"]
    text = runner.invoke(app, ["eval", str(artifact), "--prompts", str(prompts_file), "--max-new-tokens", "8"])
    # the report is eval's result: table, verdict and failing limits together on stdout (docs/ci.md's rule)
    assert text.exit_code == 1 and "FAIL (float32" in text.stdout and "mean KL" in text.stdout


def test_thresholds_can_be_overridden(checked, prompts_file):
    out = evaluate(checked["path"], "--prompts", str(prompts_file), "--max-new-tokens", "4", "--max-kl-mean", "0",
                   "--min-top1", "0.5")
    report = json.loads(out.stdout)
    assert report["thresholds"]["max_kl_mean"] == 0 and report["thresholds"]["min_top1_agreement"] == 0.5
    assert out.exit_code == (0 if report["summary"]["kl_mean"] == 0 else 1)
    # --max-kl is the limit on the largest per-position KL, as its name says (it used to set the mean's)
    out = evaluate(checked["path"], "--prompts", str(prompts_file), "--max-new-tokens", "4", "--max-kl", "7")
    report = json.loads(out.stdout)
    assert report["thresholds"]["max_kl"] == 7 and report["thresholds"]["max_kl_mean"] != 7
    assert "Loading weights" not in out.output  # transformers' own bar does not leak into the report


def test_bad_inputs_are_one_line_errors(checked, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": 3}\n')
    out = runner.invoke(app, ["eval", checked["path"], "--prompts", str(bad)])
    assert out.exit_code == 1 and f"{bad}:2" in out.stderr and "Traceback" not in out.output
    missing = runner.invoke(app, ["eval", checked["path"], "--reference", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "reference checkpoint" in missing.stderr and "--reference" in missing.stderr
    usage = runner.invoke(app, ["eval", checked["path"], "--max-new-tokens", "0"])
    assert usage.exit_code == 2


def test_neuron_artifact_is_not_run_here_and_exits_3(checked, tmp_path):
    """An NxDI artifact where NxD Inference does not import: eval says what it would run and exits 3 (neither pass nor
    fail). Where it imports, tests/upstream/test_nxdi_eval.py runs it."""
    artifact = tmp_path / "nxd"
    shutil.copytree(checked["path"], artifact)
    manifest = json.loads((artifact / "neuronpack.json").read_text())
    manifest["framework"], manifest["target"] = "nxd", {"instance": "trn1.2xlarge"}
    (artifact / "neuronpack.json").write_text(json.dumps(manifest))
    out = runner.invoke(app, ["eval", str(artifact)])
    assert out.exit_code == 3, out.output
    assert "not run: needs NxD Inference (neuronx-distributed-inference) importable" in out.stdout
    assert "trn1.2xlarge" in out.stdout and "neuronx-distributed-inference" in out.stdout
    report = json.loads(evaluate(artifact).stdout)
    assert report["status"] == "not_run" and report["summary"] is None and len(report["plan"]) == 5

