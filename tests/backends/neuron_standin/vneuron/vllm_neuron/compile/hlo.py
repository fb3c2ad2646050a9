"""TEST STAND-IN for vllm_neuron/compile/hlo.py (missing from ../shared/upstream): upstream's parallel_compile.py
reads a captured ``graph.hlo`` back with ``load_hlo_module(path)`` and hands ``SerializeToString()`` to
``neuroncc_compile``. The stand-in's "HLO" is the FX graph's text, kept as bytes."""

from __future__ import annotations

from pathlib import Path


class _HloModule:
    def __init__(self, data: bytes):
        self._data = data

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's method name
        return self._data


def load_hlo_module(path: str) -> _HloModule:
    return _HloModule(Path(path).read_bytes())
