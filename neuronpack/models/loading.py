"""Load the portable model straight from a checkpoint, one tensor at a time (never a full HF model in memory).

Quantized linears are recognised from the tensors themselves (an int8/fp8 ``<prefix>.weight`` with a
``<prefix>.scale`` beside it), never from file names.

Example::

    model = load_model(Path("SmolLM2-135M"), torch.bfloat16)
    model.forward_full(torch.tensor([[1, 2, 3]])).shape     # [1, 3, 49152]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from neuronpack.errors import CheckpointError, UnsupportedModelError
from neuronpack.models.config import ModelConfig
from neuronpack.models.registry import family
from neuronpack.progress import NullReporter, Reporter

if TYPE_CHECKING:
    import torch

    from neuronpack.checkpoint import Checkpoint
    from neuronpack.models.decoder import CausalLM

DTYPE_NAMES = ("float32", "bfloat16", "float16")
INT8, FP8 = "I8", "F8_E4M3"


def resolve_dtype(name: str, hf_config: dict) -> str:
    """The compute dtype name for a recipe's ``model.dtype`` ("auto" reads the checkpoint's dtype; float32 if the
    checkpoint is quantized or silent).

    Example: ``resolve_dtype("auto", {"torch_dtype": "bfloat16"}) == "bfloat16"``.
    """
    if name != "auto":
        if name not in DTYPE_NAMES:
            raise UnsupportedModelError(f"dtype {name!r} is not supported", where="model.dtype",
                                        fix=f"use one of auto, {', '.join(DTYPE_NAMES)}")
        return name
    declared = hf_config.get("torch_dtype") or hf_config.get("dtype")
    return declared if declared in DTYPE_NAMES else "float32"


def quantized_linears(ckpt: Checkpoint) -> dict[str, str]:
    """``{prefix: "I8" | "F8_E4M3"}`` for every weight-only quantized linear in the checkpoint."""
    names = set(ckpt.names())
    found = {}
    for name in names:
        if name.endswith(".scale") and (prefix := name[: -len(".scale")]) + ".weight" in names:
            dtype = ckpt.info(prefix + ".weight").dtype
            if dtype in (INT8, FP8):
                found[prefix] = dtype
    return found


def load_model(
    source: Path | Checkpoint,
    dtype: torch.dtype,
    *,
    max_seq_len: int | None = None,
    reporter: Reporter | None = None,
) -> CausalLM:
    """Build the portable model for a checkpoint directory (or an open ``Checkpoint``) in ``dtype``.

    int8 linears stay int8; fp8 linears are dequantized to ``dtype`` (no CPU weight-only fp8 matmul) with a warning.

    Example::

        model = load_model(Path("tiny-llama"), torch.float32)
    """
    reporter = reporter or NullReporter()
    from neuronpack.checkpoint import open_checkpoint
    from neuronpack.models.decoder import build_model

    ckpt = source if not isinstance(source, str | Path) else open_checkpoint(Path(source))
    cfg = ModelConfig.from_hf(ckpt.config, max_seq_len=max_seq_len)
    cfg = dataclasses.replace(cfg, tie_word_embeddings=cfg.tie_word_embeddings or ckpt.tied)
    names = CheckpointNames(ckpt, family(cfg.family))
    if names.left_out:
        reporter.warn(names.left_out)
    quantized = {names.ours(prefix): kind for prefix, kind in quantized_linears(ckpt).items()}
    int8 = frozenset(p for p, kind in quantized.items() if kind == INT8)
    if any(kind == FP8 for kind in quantized.values()):
        reporter.warn("fp8 weights are dequantized at load: CPU PyTorch has no weight-only fp8 matmul")
    model = build_model(cfg, dtype, int8)
    expected = model.state_dict()
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    tensors = dict(_read_tensors(ckpt, names, expected, quantized, dtype, reporter))
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    return model


def model_tensors(model: CausalLM) -> dict[str, torch.Tensor]:
    """Every tensor the compiled graphs read, by name: parameters and buffers, the tied lm_head under both names."""
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    return {name: t.detach() for name, t in tensors.items()}


class CheckpointNames:
    """Our tensor names and the checkpoint's, which differ where a family reads part of another model (Gemma 3's
    text decoder inside a multimodal checkpoint: ``language_model.model.*``); ``left_out``: what of the checkpoint
    is not run, said by name (None: everything is)."""

    def __init__(self, ckpt: Checkpoint, builder) -> None:
        stored = set(ckpt.names())
        self._theirs = builder.checkpoint_names(stored)  # ours -> theirs, where they differ
        self._ours = {theirs: ours for ours, theirs in self._theirs.items()}
        self.left_out: str | None = builder.left_out(stored)

    def theirs(self, name: str) -> str:
        return self._theirs.get(name, name)

    def ours(self, prefix: str) -> str:
        """Our name of a checkpoint module prefix (``language_model.model.layers.0.mlp.up_proj``)."""
        weight = self._ours.get(prefix + ".weight")
        return prefix if weight is None else weight[: -len(".weight")]


def _read_tensors(
    ckpt: Checkpoint, names: CheckpointNames, expected: dict, quantized: dict[str, str], dtype: torch.dtype,
    reporter: Reporter,
) -> Iterator[tuple[str, torch.Tensor]]:
    import torch

    from neuronpack.models.quant import dequantize_fp8

    with reporter.task("load weights", total=len(expected)) as task:
        for name, slot in expected.items():
            prefix, _, leaf = name.rpartition(".")
            kind = quantized.get(prefix)
            tensor = _get(ckpt, names.theirs(name))
            if kind == FP8 and leaf == "weight":
                tensor = dequantize_fp8(tensor, _get(ckpt, names.theirs(f"{prefix}.scale")), dtype)
            elif kind == INT8 and leaf == "scale":
                # Scales stay float32 (the kernel casts per call); a per-tensor [1] scale becomes per-channel.
                tensor = tensor.to(torch.float32).reshape(-1, 1).expand(slot.shape).contiguous()
            elif tensor.is_floating_point():
                tensor = tensor.to(dtype)
            if tuple(tensor.shape) != tuple(slot.shape):
                raise CheckpointError(
                    f"tensor {name} has shape {tuple(tensor.shape)}, the config implies {tuple(slot.shape)}",
                    where=str(ckpt.root),
                    fix="check that config.json belongs to these weights",
                )
            task.advance()
            yield name, tensor


def _get(ckpt: Checkpoint, name: str) -> torch.Tensor:
    try:
        return ckpt.get(name)
    except CheckpointError:
        raise CheckpointError(
            f"checkpoint is missing tensor {name}",
            where=str(ckpt.root),
            fix="check that the checkpoint is complete and matches config.json",
        ) from None
