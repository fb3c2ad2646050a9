"""TEST STAND-IN for vllm_neuron/nki/nki_dtype.py (missing from ../shared/upstream): nki_cache.py turns the stored
``str(dtype)`` ("torch.bfloat16") back into a torch dtype."""

from __future__ import annotations

import torch


def str_to_torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name}")
    return dtype
