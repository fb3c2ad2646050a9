"""What an artifact is scored against (accuracy/reference.py) and the thresholds it is held to, on tiny artifacts
against transformers:

- built from a `neuronpack quantize`d checkpoint (int8, fp8): eval without flags passes its weights' thresholds
  against the float checkpoint quantize recorded; with that checkpoint gone, against the quantized one dequantized
  (transformers alone would read the int8 values as floats and drop the scales);
- a checkpoint that ties its head in config.json but stores another lm_head.weight (transformers writes such a
  checkpoint itself): compile refuses it with one line, eval refuses it as a reference, and either way out of it
  builds an artifact that agrees with transformers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from neuronpack.accuracy import THRESHOLDS
from neuronpack.cli.app import app
from neuronpack.pipeline import compile_model
from tests.cli.test_eval_cmd import FAST, RECIPE, runner
from tests.cli.test_eval_cmd import TWO_PROMPTS as PROMPTS

pytestmark = pytest.mark.slow


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def evaluate(artifact: Path, *args: str) -> tuple[int, dict]:
    out = runner.invoke(app, ["eval", str(artifact), "--format", "json", "--max-new-tokens", "12", *args])
    assert out.stdout.strip(), out.output
    return out.exit_code, json.loads(out.stdout)


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_an_artifact_of_a_quantized_checkpoint_passes_eval_without_flags(tiny_llama, tmp_path, prompts, dtype):
    source = Path(shutil.copytree(tiny_llama, tmp_path / "source"))
    quantized = tmp_path / f"model-{dtype}"
    done = runner.invoke(app, ["quantize", str(source), "--out", str(quantized), "--dtype", dtype, "--quiet"])
    assert done.exit_code == 0, done.output
    artifact = compile_model(str(quantized), recipe=RECIPE, overrides=FAST, out_root=tmp_path / "root").path

    code, report = evaluate(artifact, "--prompts", str(prompts))
    assert code == 0, report
    assert report["precision"] == dtype and report["thresholds"] == THRESHOLDS[dtype].to_dict()
    # the float checkpoint quantize recorded: the figures hold the quantization error, as a recipe's int8 build's do
    assert (report["reference"], report["reference_dequantized"]) == (str(source), False)
    against_source = report["summary"]

    shutil.rmtree(source)  # quantized elsewhere, or the original since removed: the quantized one, dequantized
    code, report = evaluate(artifact, "--prompts", str(prompts))
    assert code == 0, report
    assert (report["reference"], report["reference_dequantized"]) == (str(quantized), True)
    # the same weights on both sides now: what is left is the kernels' rounding, far below quantization's
    assert report["summary"]["kl_mean"] < against_source["kl_mean"]
    assert report["summary"]["top1_agreement"] >= against_source["top1_agreement"]
    text = runner.invoke(app, ["eval", str(artifact), "--prompts", str(prompts), "--max-new-tokens", "4"])
    assert f"vs {quantized} (dequantized)" in text.stdout.replace("\n", "")
    assert f"PASS ({dtype} thresholds" in text.stdout

    given = evaluate(artifact, "--prompts", str(prompts), "--reference", str(quantized))[1]
    assert given["reference_dequantized"] is True and given["status"] == "passed"


def tied_with_another_head(tiny_llama: Path, out: Path) -> Path:
    """A checkpoint transformers writes itself: the untied tiny model loaded with tie_word_embeddings true keeps its
    own head ("both are present ... so we will NOT tie them"), and save_pretrained stores both lm_head.weight and the
    embedding, with different values, under a config that ties them."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, tie_word_embeddings=True)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    model.save_pretrained(out)
    for path in tiny_llama.iterdir():  # the tokenizer files and the chat template
        if not (out / path.name).exists():
            shutil.copy(path, out / path.name)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    return out


def test_a_tied_head_with_another_head_stored_is_refused_and_either_fix_builds_what_transformers_reads(
        tiny_llama, tmp_path, prompts):
    model = tied_with_another_head(tiny_llama, tmp_path / "tied")
    compiled = runner.invoke(app, ["compile", str(model), "--recipe", str(RECIPE), "--set", *FAST, "--out-root",
                                   str(tmp_path / "root"), "--quiet"])
    assert compiled.exit_code == 1
    [line] = compiled.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("error: config.json ties the LM head to the embeddings (tie_word_embeddings: true) but "
                           "the weights store an lm_head.weight that differs from model.embed_tokens.weight")
    assert str(model / "config.json") in line and '"tie_word_embeddings": false' in line
    assert not (tmp_path / "root" / "neuron-compiled-artifacts").exists() or not any(
        p.name[0] != "." for p in (tmp_path / "root" / "neuron-compiled-artifacts").iterdir())

    good = compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=tmp_path / "root").path
    refused = runner.invoke(app, ["eval", str(good), "--reference", str(model)])
    assert refused.exit_code == 1 and "differs from model.embed_tokens.weight" in refused.stderr

    # the stored head, as transformers reads it: untie in config.json
    untied = Path(shutil.copytree(model, tmp_path / "untied"))
    config = json.loads((untied / "config.json").read_text())
    (untied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    # the embeddings, as vLLM and NxDI read it: drop the stored head
    from safetensors.torch import load_file, save_file

    tied = Path(shutil.copytree(model, tmp_path / "tied-only"))
    tensors = load_file(tied / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, tied / "model.safetensors", metadata={"format": "pt"})
    for fixed in (untied, tied):
        artifact = compile_model(str(fixed), recipe=RECIPE, overrides=FAST, out_root=tmp_path / "root").path
        code, report = evaluate(artifact, "--prompts", str(prompts))
        assert code == 0 and report["summary"]["top1_agreement"] == 1.0, report
