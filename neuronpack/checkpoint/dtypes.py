"""The one dtype table: safetensors dtype codes and the torch dtypes they stand for (torch-free until a torch dtype
is asked for).

Example::

    torch_dtype_name("BF16")                # "bfloat16"
    safetensors_dtype(torch.float8_e4m3fn)  # "F8_E4M3"
    FLOAT_CODES["F16"]                      # "float16": the floating dtypes model weights come in
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# safetensors code -> torch dtype name, for every code torch can hold (F4 / F6 have no torch dtype).
TORCH_NAMES: dict[str, str] = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
}
# The floating dtypes model weights are stored and computed in (also GGML's names for its unquantized types).
FLOAT_CODES: dict[str, str] = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def torch_dtype_name(code: str) -> str | None:
    """The torch dtype name of a safetensors code, None when torch has none."""
    return TORCH_NAMES.get(code)


def torch_dtype(code: str) -> torch.dtype:
    """The torch dtype of a safetensors code; ValueError when torch (this version) has none."""
    import torch

    name = TORCH_NAMES.get(code)
    if name is None or not hasattr(torch, name):
        raise ValueError(f"safetensors dtype {code} has no torch equivalent")
    return getattr(torch, name)


def safetensors_dtype(dtype: torch.dtype) -> str:
    """The safetensors dtype string of a torch dtype, e.g. ``safetensors_dtype(torch.bfloat16) == "BF16"``."""
    name = str(dtype).removeprefix("torch.")
    for code, torch_name in TORCH_NAMES.items():
        if torch_name == name:
            return code
    raise ValueError(f"torch dtype {dtype} has no safetensors equivalent")
