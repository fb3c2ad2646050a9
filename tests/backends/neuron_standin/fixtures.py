"""Fixtures that put the stand-in Neuron SDK (or a PyPI-style placeholder) on sys.path for one test.

The stand-in replaces only what cannot run here (the Neuron SDK); everything else in a test is real.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from neuronpack.backends.neuron.packages import clear_probe_cache

STANDIN = Path(__file__).parent
SDK_MODULES = ("neuronx_distributed_inference", "transformers_neuronx", "neuronxcc", "torch_neuronx")


def _purge() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in SDK_MODULES:
            del sys.modules[name]
    clear_probe_cache()


@pytest.fixture
def sdk_path(monkeypatch):
    """use(*roots): prepend stand-in roots ("nxd", "tnx", "compiler") or any directory to sys.path."""

    def use(*roots: str | Path) -> None:
        for root in roots:
            path = root if isinstance(root, Path) else STANDIN / root
            monkeypatch.syspath_prepend(str(path))
        _purge()

    _purge()
    yield use
    _purge()


@pytest.fixture
def nxd_sdk(sdk_path):
    """The NxDI stand-in plus compiler; returns its call record module."""
    sdk_path("nxd", "compiler")
    from neuronx_distributed_inference import _standin

    _standin.CALLS.clear()
    return _standin


@pytest.fixture
def tnx_sdk(sdk_path):
    sdk_path("tnx", "compiler")
    from transformers_neuronx import _standin

    _standin.CALLS.clear()
    return _standin


def make_placeholder(root: Path, dist: str, *, style: str) -> Path:
    """A package like PyPI's 1.5 kB Neuron placeholders, under ``root`` (add root to sys.path).

    style "pypi": exactly what the real wheel installs (a hyphenated directory, so the module is missing, and
    metadata saying WRONG PACKAGE); style "raises": an importable module whose import raises that message."""
    message = "WRONG PACKAGE. Please install the package from Neuron Repository - pip.repos.neuron.amazonaws.com"
    module = dist.replace("-", "_")
    info = root / f"{module}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\nSummary: UNKNOWN\n\n{message}\n")
    package = root / (dist if style == "pypi" else module)
    package.mkdir()
    (package / "__init__.py").write_text(f"raise ImportError({message!r})\n")
    return root
