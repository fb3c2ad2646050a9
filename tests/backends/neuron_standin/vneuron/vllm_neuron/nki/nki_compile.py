"""TEST STAND-IN for vllm_neuron/nki/nki_compile.py (missing from ../shared/upstream): nki_cache.py stores and reads
``NKICompileResult`` with these three fields (put_nki_cache / _read_cache_file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class NKICompileResult:
    dumped_config: str
    return_types: tuple = ()
    operand_output_aliases: dict[int, Any] = field(default_factory=dict)
