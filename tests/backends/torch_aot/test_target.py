"""The torch backend's target: torch-free, equal to what torch itself reports, and refusals that name both values."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from neuronpack.backends.torch_aot.layout import FORMAT_VERSION
from neuronpack.backends.torch_aot.target import (
    cpu_capability,
    current_target,
    cxx_compiler,
    effective_compiler,
    target_mismatch,
)

AVX512_FLAGS = "flags\t\t: fpu sse avx avx2 fma avx512f avx512dq avx512bw avx512vl\n"


def test_cpu_capability_equals_torch():
    assert cpu_capability() == torch.backends.cpu.get_cpu_capability()


@pytest.mark.skipif(cpu_capability() == "DEFAULT", reason="no vector ISA to lower from on this machine")
def test_aten_cpu_capability_override_agrees_with_torch():
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == cpu_capability(env={"ATEN_CPU_CAPABILITY": "default"}) == "DEFAULT"


def test_cpu_capability_from_flags():
    assert cpu_capability(AVX512_FLAGS, env={}) == "AVX512"
    assert cpu_capability("flags : sse avx avx2 fma\n", env={}) == "AVX2"
    assert cpu_capability("flags : sse avx\n", env={}) == "DEFAULT"
    # The override can lower the capability, never raise it above what the CPU has.
    assert cpu_capability(AVX512_FLAGS, env={"ATEN_CPU_CAPABILITY": "avx2"}) == "AVX2"
    assert cpu_capability("flags : avx2 fma\n", env={"ATEN_CPU_CAPABILITY": "avx512"}) == "AVX2"


def test_target_is_computed_without_importing_torch():
    from tests.helpers.fresh_interpreter import run_fresh

    code = (
        "import json\n"
        "from neuronpack.backends.torch_aot import TorchAotBackend\n"
        "from neuronpack.recipe import Recipe\n"
        "print(json.dumps(TorchAotBackend().target(Recipe())))\n"
    )
    out, torch_imported = run_fresh(code)
    target = json.loads(out)
    assert not torch_imported
    assert target["torch"] == torch.__version__
    assert target["device"] == "cpu"
    # the artifact format is keyed: a neuronpack writing another format rebuilds instead of hitting an old artifact
    assert target["format_version"] == FORMAT_VERSION


def test_aoti_target_records_compiler_and_settings():
    target = current_target("aoti")
    assert target["cxx"] == cxx_compiler() and target["cxx"]["path"]
    assert target["inductor"]["aot_inductor.package_constants_in_so"] is False
    assert set(current_target("export")) == {"compiler", "device", "torch"}  # portable across CPUs


def test_no_cxx_compiler_falls_back_to_export(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert cxx_compiler("/nonexistent/c++") is None
    assert effective_compiler("aoti") == "export"
    assert effective_compiler("export") == "export"


def test_mismatch_names_both_values():
    built = {"compiler": "aoti", "device": "cpu", "torch": "2.13.0", "cpu_capability": "AVX512"}
    here = {**built, "cpu_capability": "AVX2"}
    assert target_mismatch(built, here) == "built for CPU capability AVX512, this machine has AVX2"
    assert "2.9.0" in target_mismatch({**built, "torch": "2.9.0"}, built)
    assert target_mismatch(built, dict(built)) is None
