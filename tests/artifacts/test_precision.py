"""The weights' precision of an artifact, from its manifest: the recipe's quantization, a pre-quantized checkpoint's
config.json section, or the float dtype; and the same answer in `inspect` and `ls` (text and JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from neuronpack.artifacts.precision import weights_precision
from neuronpack.cli.app import app
from tests.helpers.manifests import make_manifest

RECIPE = str(Path(__file__).parents[2] / "recipes" / "tiny-test.toml")
SMALL = ["--set", "compiler=export", "--set", "target.seq_len=64", "--set", "target.max_context_length=16",
         "--set", "buckets.context=[16]", "--set", "buckets.token_generation=[64]"]
NEURONPACK_INT8 = {"method": "neuronpack-symmetric", "dtype": "int8", "granularity": "per-channel",
                   "modules_to_not_convert": ["layers.0.mlp"], "include_lm_head": True}


@pytest.mark.parametrize("recipe, config, expected", [
    ({}, {"torch_dtype": "bfloat16"}, "bfloat16 (not quantized)"),
    ({"model": {"dtype": "float32"}}, {"torch_dtype": "bfloat16"}, "float32 (not quantized)"),
    ({"quantization": {"dtype": "fp8", "granularity": "per-tensor"}}, {},
     "fp8 per-tensor (lm_head float, from the recipe)"),
    ({}, {"quantization": NEURONPACK_INT8},
     "int8 per-channel (lm_head included, 1 module(s) kept float, from the checkpoint)"),
    ({}, {"quantization": {**NEURONPACK_INT8, "modules_to_not_convert": ["lm_head"]}},
     "int8 per-channel (lm_head float, from the checkpoint)"),
    ({}, {"quantization_config": {"quant_method": "fp8"}}, "fp8 (from the checkpoint)"),
])
def test_precision_from_recipe_checkpoint_or_float(recipe, config, expected):
    manifest = make_manifest(recipe=recipe, model={"config": config})
    assert weights_precision(manifest).describe() == expected


def test_inspect_and_ls_show_an_int8_checkpoints_precision(tiny_llama, tmp_path):
    """An artifact compiled from a checkpoint `neuronpack quantize` made (the recipe has no [quantization]) used to
    read "quantization None" in inspect."""
    runner = CliRunner(env={"COLUMNS": "400"})  # wide enough for ls's row of a long tmp path on one line
    int8 = tmp_path / "checkpoint-q"  # a name that does not say int8: only the weights row may
    done = runner.invoke(app, ["quantize", str(tiny_llama), "--out", str(int8), "--dtype", "int8",
                               "--include-lm-head", "--quiet"])
    assert done.exit_code == 0, done.output
    built = runner.invoke(app, ["compile", str(int8), "--recipe", RECIPE, *SMALL, "--out-root", str(tmp_path),
                                "--format", "json", "--quiet"])
    assert built.exit_code == 0, built.output
    path = json.loads(built.stdout)["path"]
    expected = "int8 per-channel (lm_head included, from the checkpoint)"

    shown = runner.invoke(app, ["inspect", path])
    assert shown.exit_code == 0 and expected in shown.stdout
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in shown.stdout.splitlines()
            if line.count("│") == 3}
    # one row says what the weights are; none contradicts it (it read "quantization  none" two rows below)
    assert [field for field, value in rows.items() if "int8" in value or "quantiz" in field] == ["weights"]
    assert rows["compute dtype"] == "float32"  # the quantized checkpoint's torch_dtype, not "auto"
    as_json = json.loads(runner.invoke(app, ["inspect", path, "--format", "json"]).stdout)
    assert as_json["weights_precision"]["dtype"] == "int8"
    assert as_json["weights_precision"]["lm_head_quantized"] is True
    listed = runner.invoke(app, ["ls", "--root", str(tmp_path)])
    assert expected in listed.stdout
    rows = json.loads(runner.invoke(app, ["ls", "--root", str(tmp_path), "--format", "json"]).stdout)["artifacts"]
    assert [r["weights_precision"]["description"] for r in rows] == [expected]
