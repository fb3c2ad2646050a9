"""`compile --check-accuracy` of an nxd recipe where NxD Inference does not import (the test stand-in SDK builds):
the check before the Neuron compile is recorded as not run with the reason, the build goes on, exit 3. (Where NxDI
imports, tests/upstream/test_nxdi_eval.py runs the check itself before the compile.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "backends" / "neuron_standin"


def test_nxd_check_before_compile_without_nxdi_is_recorded_as_not_run(tiny_llama, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STANDIN / "nxd"), str(STANDIN / "compiler")])}
    out = subprocess.run([sys.executable, "-m", "neuronpack", "compile", str(tiny_llama), "--recipe",
                          str(ROOT / "recipes" / "llama-3.2-1b-inf2.toml"), "--out-root", str(tmp_path),
                          "--check-accuracy", "--format", "json", "--progress", "none"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 3, out.stderr[-2000:]
    result = json.loads(out.stdout)
    accuracy = result["accuracy"]
    assert accuracy["status"] == "not_run" and accuracy["stage"] == "before_compile"
    assert "needs NxD Inference" in accuracy["reason"]
    assert "accuracy check before the Neuron compile not run" in out.stderr
    manifest = json.loads((Path(result["path"]) / "neuronpack.json").read_text())
    assert manifest["accuracy"]["stage"] == "before_compile"  # the build went on and recorded it


def test_nxd_build_of_a_quantized_checkpoint_as_float_is_stopped_before_the_compile(tiny_llama, tmp_path):
    """A `neuronpack quantize`d checkpoint compiled by an nxd recipe without [quantization]: the NeuronConfig says
    quantized: false, so NxD Inference would read the int8 values as floats (on the device as on the CPU). The check
    knows it from the config alone, where NxDI does not import too: one line, exit 1, nothing published."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STANDIN / "nxd"), str(STANDIN / "compiler")])}
    quantized = tmp_path / "int8"
    done = subprocess.run([sys.executable, "-m", "neuronpack", "quantize", str(tiny_llama), "--out", str(quantized),
                           "--dtype", "int8", "--quiet"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    out = subprocess.run([sys.executable, "-m", "neuronpack", "compile", str(quantized), "--recipe",
                          str(ROOT / "recipes" / "llama-3.2-1b-inf2.toml"), "--out-root", str(tmp_path / "root"),
                          "--check-accuracy", "--quiet"], capture_output=True, text=True, env=env)
    assert out.returncode == 1, out.stderr[-2000:]
    [line] = out.stderr.strip().splitlines()
    assert "artifact's NeuronConfig has quantized: false" in line and "[quantization] section" in line
    assert not [p for p in (tmp_path / "root" / "neuron-compiled-artifacts").iterdir() if not p.name.startswith(".")]
