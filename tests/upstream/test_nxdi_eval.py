"""`neuronpack eval` of an nxd artifact where NxD Inference imports: upstream NxDI 0.9.0's CPU path judges it.

The artifact (the int8 recipe on a tiny Llama) is built with the test stand-in SDK (tests/backends/neuron_standin:
neuronx-cc is not here); eval then runs in ``.venv-nxdi`` with upstream's sources and the strict closed-package shim
(tests/upstream/shim_site/sitecustomize.py). It must print NxDI-vs-transformers figures (and, quantized, the figures
against the dequantized weights) and exit 0; a scale of the wrong shape planted in the quantized checkpoint must
make it exit 1 with one line naming the tensor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.upstream.test_nxdi_cpu import ROOT, _plant_bad_scale, nxdi_setup

STANDIN = ROOT / "tests" / "backends" / "neuron_standin"
INT8_RECIPE = ROOT / "recipes" / "llama-3.1-8b-instruct-int8-trn1.toml"


@pytest.fixture(scope="module")
def nxd_artifact(tmp_path_factory):
    sources, python, work, llama = nxdi_setup(tmp_path_factory, "nxd-eval")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STANDIN / "nxd"), str(STANDIN / "compiler")])}
    built = subprocess.run([sys.executable, "-m", "neuronpack", "compile", str(llama), "--recipe", str(INT8_RECIPE),
                            "--out-root", str(work / "root"), "--progress", "none"], capture_output=True, text=True,
                           env=env, check=True).stdout.strip().splitlines()[-1]
    return Path(built), python, sources, work


def _eval(python: Path, sources, artifact: Path, work: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "upstream" / "shim_site"), str(ROOT)]),
           "NEURONPACK_UPSTREAM_PATH": os.pathsep.join(str(s) for s in sources), "PYTHONWARNINGS": "ignore",
           "NEURONPACK_CLOSED_CALLS": str(work / "closed-calls.json"), "COLUMNS": "160"}
    return subprocess.run([str(python), "-m", "neuronpack", "eval", str(artifact), "--progress", "none",
                           "--max-new-tokens", "8", *args], capture_output=True, text=True, env=env)


def test_eval_runs_nxdi_on_the_cpu_and_passes(nxd_artifact):
    artifact, python, sources, work = nxd_artifact
    out = _eval(python, sources, artifact, work, "--format", "json")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert json.loads((work / "closed-calls.json").read_text()) == [], "closed Neuron code ran on the CPU path"
    report = json.loads(out.stdout.strip().splitlines()[-1])  # NxD's logger prints its set-up lines on stdout
    assert report["status"] == "passed" and report["framework"] == "nxd" and report["precision"] == "int8"
    assert "tp 1" in report["plan"][0] and "tp 8" in report["plan"][0]
    dequantized = report["summary"]["vs_dequantized"]
    # bf16 (the recipe's dtype) on both sides: what is left is rounding, far below the int8 thresholds
    assert dequantized["top1_agreement"] >= report["summary"]["top1_agreement"] - 0.05
    assert dequantized["kl_mean"] < 1e-3


def test_eval_refuses_a_planted_scale_of_the_wrong_shape(nxd_artifact, tmp_path):
    artifact, python, sources, work = nxd_artifact
    manifest = json.loads((artifact / "neuronpack.json").read_text())
    quantized = Path(manifest["compile_config"]["neuron_config"]["quantized_checkpoints_path"])
    planted = _plant_bad_scale(quantized, tmp_path / "planted")
    original = quantized.with_name(quantized.name + ".good")
    quantized.rename(original)
    try:
        planted.rename(quantized)
        out = _eval(python, sources, artifact, work)
    finally:
        if quantized.exists():
            import shutil

            shutil.rmtree(quantized)
        original.rename(quantized)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "layers.0.mlp.down_proj.scale" in errors[0], out.stderr[-3000:]
    assert "Traceback" not in out.stderr
