"""Helpers both Neuron backends (nxd, tnx) use: the recipe's Neuron instance, the dtype, the checkpoint's config.

They live here, not in nxd.py, so tnx.py does not depend on the NxDI backend module.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from neuronpack.errors import CheckpointError, RecipeError

if TYPE_CHECKING:  # a Recipe or recipe_memo's RecipeView: a cache hit's target() imports no pydantic
    from neuronpack.recipe import Recipe

NEURON_INSTANCES = ("trn1", "trn2", "inf2")  # the recipe's target.instance values nxd / tnx can target
# vLLM's names (vllm/platforms/neuron.py NeuronFramework) <-> ours
VLLM_FRAMEWORK_NAMES = {"neuronx-distributed-inference": "nxd", "transformers-neuronx": "tnx"}
FRAMEWORK_TO_VLLM = {v: k for k, v in VLLM_FRAMEWORK_NAMES.items()}


def neuron_instance(recipe: Recipe, framework: str) -> str:
    """The recipe's instance for ``framework``; RecipeError when it is not a Neuron instance."""
    instance = recipe.instance_for(framework)
    if instance not in NEURON_INSTANCES:
        raise RecipeError(
            f"target.instance {instance!r} is not a Neuron instance, so {framework} cannot target it",
            where="target.instance", fix=f"use one of {', '.join(NEURON_INSTANCES)}, or --framework torch")
    return instance


def model_dtype(recipe: Recipe, hf_config: dict) -> str:
    """The recipe's dtype; "auto" takes the checkpoint's, else NxDI's default bfloat16."""
    if recipe.model.dtype != "auto":
        return recipe.model.dtype
    value = hf_config.get("torch_dtype") or hf_config.get("dtype") or "bfloat16"
    return str(value).removeprefix("torch.")


def read_model_config(model_dir: Path, *, allow_missing: bool = False) -> dict:
    """config.json as a dict (torch-free). ``allow_missing``: {} when the directory does not exist yet."""
    path = Path(model_dir) / "config.json"
    if allow_missing and not Path(model_dir).exists():
        return {}
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError("config.json not found", where=str(path), fix="pass a Hugging Face checkpoint") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"config.json is unreadable: {exc}", where=str(path), fix="fix the file") from None


def import_class(path: str):
    """``"pkg.module.Class"`` -> the class (imports the SDK module: only in build paths)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def version_tuple(version: str | None) -> tuple[int, ...]:
    """``"0.9.17334"`` -> (0, 9, 17334); leading numeric parts only; () for None/"absent"."""
    parts: list[int] = []
    for piece in str(version or "").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    """Run a block with ``path`` as the working directory (contextlib.chdir needs Python 3.11)."""
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)
