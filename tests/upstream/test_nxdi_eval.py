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


def _neuronpack(python: Path, sources, work: Path, *args: str) -> subprocess.CompletedProcess:
    """``neuronpack ARGS`` in .venv-nxdi with upstream NxDI importable and the closed packages the strict shim."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "upstream" / "shim_site"), str(ROOT)]),
           "NEURONPACK_UPSTREAM_PATH": os.pathsep.join(str(s) for s in sources), "PYTHONWARNINGS": "ignore",
           "NEURONPACK_CLOSED_CALLS": str(work / "closed-calls.json"), "COLUMNS": "160"}
    return subprocess.run([str(python), "-m", "neuronpack", *args, "--progress", "none"], capture_output=True,
                          text=True, env=env)


def _eval(python: Path, sources, artifact: Path, work: Path, *args: str) -> subprocess.CompletedProcess:
    return _neuronpack(python, sources, work, "eval", str(artifact), "--max-new-tokens", "8", *args)


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


def test_compile_check_accuracy_runs_nxdi_before_the_neuron_compile(nxd_artifact, tmp_path):
    """``compile --check-accuracy`` of the int8 recipe where NxDI imports: the CPU check passes first, then the
    compile starts (and, torch-neuronx being the closed shim here, fails in NxD's ModelBuilder). A scale transposed
    in the cached quantized checkpoint (same file size, so the quantize cache takes it) is then refused by NxDI
    before any compile: one error line naming the tensor, no closed call, nothing published."""
    _, python, sources, work = nxd_artifact
    llama, root = work / "llama", tmp_path / "root"
    args = ("compile", str(llama), "--recipe", str(INT8_RECIPE), "--out-root", str(root), "--check-accuracy")
    first = _neuronpack(python, sources, work, *args)
    assert first.returncode == 1, first.stderr[-3000:]
    lines = first.stderr.splitlines()
    passed = [i for i, line in enumerate(lines) if "accuracy before the Neuron compile: passed" in line]
    failed = [i for i, line in enumerate(lines) if line.startswith("error") and "nxd build failed" in line]
    assert passed and failed and passed[0] < failed[0], first.stderr[-3000:]
    # the failure log: NxDI's compile() reached NxD's ModelBuilder, which needs the closed torch_neuronx
    (log,) = (root / "neuron-compiled-artifacts" / ".failed").glob("*.log")
    assert "model.compile(" in log.read_text() and "ModelBuilder" in log.read_text(), log.read_text()[-2000:]

    (quantized,) = (root / "quantized-checkpoints").iterdir()
    _transpose_in_header(quantized / "model.safetensors", "model.layers.0.mlp.down_proj.scale")
    second = _neuronpack(python, sources, work, *args)
    assert second.returncode == 1, second.stderr[-3000:]
    errors = [line for line in second.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "layers.0.mlp.down_proj.scale" in errors[0], second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    assert json.loads((work / "closed-calls.json").read_text()) == [], "the Neuron compile started"
    assert not [p for p in root.iterdir() if (p / "neuronpack.json").is_file()]


def _transpose_in_header(shard: Path, name: str) -> None:
    """Rewrite ``name``'s shape [out, 1] as [1, out] in the safetensors header, in place: same bytes, same size."""
    import struct

    data = bytearray(shard.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    header[name]["shape"] = header[name]["shape"][::-1]
    text = json.dumps(header, separators=(",", ":")).encode().ljust(length)  # safetensors pads headers with spaces
    assert len(text) == length
    data[8:8 + length] = text
    shard.write_bytes(bytes(data))


def test_a_reused_artifact_runs_in_nxdi_on_the_new_weights(nxd_artifact, tmp_path):
    """A fine-tune compiled with the donor's traced model (no Neuron compile), its weights quantized and sharded
    again: upstream NxDI's CPU run of it passes against transformers on the NEW checkpoint."""
    from tests.helpers.tiny_models import fine_tune_copy

    artifact, python, sources, work = nxd_artifact
    tuned = fine_tune_copy(work / "llama", tmp_path / "fine-tune", seed=5)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STANDIN / "nxd"), str(STANDIN / "compiler")])}
    built = json.loads(subprocess.run(
        [sys.executable, "-m", "neuronpack", "compile", str(tuned), "--recipe", str(INT8_RECIPE), "--out-root",
         str(work / "root"), "--progress", "none", "--format", "json"], capture_output=True, text=True, env=env,
        check=True).stdout)
    assert built["graphs_from"]["key"] == artifact.name
    reused = Path(built["path"])
    manifest = json.loads((reused / "neuronpack.json").read_text())
    assert manifest["model"]["original_path"] == str(tuned)
    out = _eval(python, sources, reused, work, "--format", "json")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["status"] == "passed" and report["summary"]["vs_dequantized"]["kl_mean"] < 1e-3
