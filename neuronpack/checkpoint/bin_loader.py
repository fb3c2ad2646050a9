"""Safe loading of ``pytorch_model.bin`` checkpoints.

A .bin file is a pickle, and unpickling can run arbitrary code. We only ever call
``torch.load(path, weights_only=True, mmap=True, map_location="cpu")``: torch's restricted unpickler accepts tensors
and plain containers and refuses anything that needs code (a pickled callable, ``os.system``, a custom class).
``mmap=True`` maps the file instead of reading it, so listing names and shapes costs almost no memory.

Example::

    tensors, file_of = load_bin_files([Path("pytorch_model.bin")])
    infos = tensor_infos(tensors, file_of)
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING

from neuronpack.checkpoint.safetensors_header import TensorInfo, duplicate_tensor_error
from neuronpack.errors import CheckpointError

if TYPE_CHECKING:
    import torch

CONVERT_FIX = (
    "if you trust its source, convert it once to safetensors, e.g. "
    "python -c \"import torch; from safetensors.torch import save_file; "
    "save_file(torch.load('pytorch_model.bin', weights_only=False), 'model.safetensors')\" "
    "(or load it with transformers and save_pretrained(..., safe_serialization=True))"
)


def load_bin_files(files: list[Path]) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    """Load every .bin shard (mmap, weights only); return (name -> tensor, name -> file). Duplicates are refused."""
    tensors: dict[str, torch.Tensor] = {}
    file_of: dict[str, Path] = {}
    for file in files:
        for name, tensor in load_bin_file(file).items():
            if name in tensors:
                raise duplicate_tensor_error(name, file_of[name], file)
            tensors[name] = tensor
            file_of[name] = file
    return tensors, file_of


def load_bin_file(file: Path) -> dict[str, torch.Tensor]:
    """One .bin file as a flat ``{name: tensor}``; refuses pickles that need code to load."""
    import torch

    try:
        state = torch.load(file, weights_only=True, mmap=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise _unsafe(file, exc) from None
    except RuntimeError as exc:
        if "weights only" in str(exc).lower() or "weights_only" in str(exc):
            raise _unsafe(file, exc) from None
        if "mmap" in str(exc):
            # Files in torch's legacy (pre-1.6, non-zip) format cannot be memory-mapped; still weights-only.
            state = _load_legacy(file)
        else:
            raise _corrupt(file, exc) from None
    except (EOFError, OSError, ValueError) as exc:
        raise _corrupt(file, exc) from None
    return _flatten(file, state)


def tensor_infos(tensors: dict[str, torch.Tensor], file_of: dict[str, Path]) -> dict[str, TensorInfo]:
    """TensorInfo for every loaded tensor, with safetensors dtype strings."""
    from neuronpack.checkpoint.dtypes import safetensors_dtype

    infos = {}
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        infos[name] = TensorInfo(name, safetensors_dtype(tensor.dtype), tuple(tensor.shape), file_of[name], nbytes)
    return infos


def _load_legacy(file: Path) -> object:
    import torch

    try:
        return torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise _unsafe(file, exc) from None
    except Exception as exc:  # noqa: BLE001 - any failure here is a corrupt file for the user
        raise _corrupt(file, exc) from None


def _flatten(file: Path, state: object) -> dict[str, torch.Tensor]:
    import torch

    # Some trainers save {"state_dict": {...}} or {"model": {...}}; accept one level of nesting.
    if isinstance(state, dict) and len(state) == 1:
        (inner,) = state.values()
        if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
            state = inner
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(
            "not a state dict of tensors", where=str(file), fix="save it with torch.save(model.state_dict(), path)"
        )
    return {str(k): v for k, v in state.items()}


def _unsafe(file: Path, exc: BaseException) -> CheckpointError:
    return CheckpointError(
        f"refusing an unsafe pickle: loading it would run code ({_unpickler_reason(exc)})",
        where=str(file),
        fix=CONVERT_FIX,
    )


def _unpickler_reason(exc: BaseException) -> str:
    """The line of torch's long message that says what was refused, e.g. ``... unsupported GLOBAL posix.system ...``."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if "WeightsUnpickler error:" in line:
            return line.split("WeightsUnpickler error:", 1)[1].strip()[:160]
        if "unsupported GLOBAL" in line or "Unsupported global" in line:
            return line.rstrip(".")[:160]
    return (lines[0] if lines else type(exc).__name__)[:160]


def _corrupt(file: Path, exc: BaseException) -> CheckpointError:
    return CheckpointError(
        f"cannot read PyTorch weights file ({type(exc).__name__}: {str(exc)[:160]})",
        where=str(file),
        fix="re-download it, or convert it to safetensors",
    )
