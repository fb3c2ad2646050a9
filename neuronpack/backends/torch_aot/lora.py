"""LoRA in a portable artifact: the adapters travel as PEFT copies in ``lora/<name>/`` and are stacked into the
graphs' ``lora_A`` / ``lora_B`` tensors wherever a model is made from the artifact (the build, a compile worker,
the loader), so the artifact stores each adapter once, in the format users know.

``neuron_config.json`` records the layout and the slot order (``ArtifactConfig.lora``, a ``LoraConfig``)::

    "lora": {"max_loras": 2, "max_rank": 16, "target_modules": ["q_proj", ...],
             "adapters": [{"name": "sql", "path": "lora/sql", "rank": 8}, ...]}   # slot 1, 2, ...

Example::

    section = lora_section(recipe.lora, request.adapter_dirs())  # ArtifactConfig.lora (torch-free)
    attach_artifact_lora(model, config.lora, artifact_dir)       # zero stacks + every adapter in its slot
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from neuronpack.artifacts.paths import member_path
from neuronpack.backends.torch_aot.artifact_config import LoraAdapterEntry, LoraConfig
from neuronpack.checkpoint.lora import LINEAR_BLOCKS, copy_adapters, lora_path, read_adapter
from neuronpack.errors import ArtifactError, RecipeError

if TYPE_CHECKING:
    from neuronpack.recipe import LoraSection


def check_lora_recipe(lora: LoraSection | None) -> None:
    """What the portable graphs can compile: every adapter resident (no swapping), Llama-family linears only."""
    if lora is None:
        return
    unknown = [m for m in lora.target_modules if m not in LINEAR_BLOCKS]
    if unknown:
        raise RecipeError(f"lora.target_modules {unknown} are not linears the torch backend adapts", where="recipe",
                          fix=f"use some of {', '.join(LINEAR_BLOCKS)}")
    if len(lora.adapters) > lora.max_loras:
        raise RecipeError(f"{len(lora.adapters)} lora adapters but lora.max_loras = {lora.max_loras}: the torch "
                          "backend keeps every adapter resident", where="recipe",
                          fix=f"set lora.max_loras = {len(lora.adapters)} (or list fewer adapters)")


def lora_section(lora: LoraSection | None, adapter_dirs: dict[str, Path]) -> LoraConfig | None:
    """The artifact config's ``lora`` (torch-free): the layout and each adapter's slot (list order), path and rank."""
    if lora is None:
        return None
    adapters = []
    for adapter in lora.adapters:
        info = read_adapter(adapter.name, adapter_dirs[adapter.name], target_modules=lora.target_modules,
                            max_rank=lora.max_rank)
        adapters.append(LoraAdapterEntry(adapter.name, lora_path(adapter.name), info.rank))
    return LoraConfig(lora.max_loras, lora.max_rank, tuple(lora.target_modules), tuple(adapters))


def copy_artifact_adapters(lora: LoraConfig | None, adapter_dirs: dict[str, Path], staging: Path) -> None:
    if lora:
        copy_adapters(adapter_dirs, staging, {a.name: a.path for a in lora.adapters})


def attach_artifact_lora(model, lora: LoraConfig | None, artifact_dir: Path) -> None:
    """Give ``model`` the artifact's LoRA stacks, every adapter in its slot (nothing without LoRA). ArtifactError
    when an adapter copy is missing or no longer valid."""
    from neuronpack.errors import CheckpointError
    from neuronpack.models.lora import LoraLayout, attach_lora, fill_lora

    if not lora:
        return
    layout = LoraLayout(lora.max_loras, lora.max_rank, lora.target_modules)
    paths = [member_path(Path(artifact_dir), a.path) for a in lora.adapters]  # untrusted: stays inside
    try:
        infos = [read_adapter(a.name, path, target_modules=layout.target_modules, max_rank=layout.max_rank)
                 for a, path in zip(lora.adapters, paths, strict=True)]
        attach_lora(model, layout)
        fill_lora(model, layout, infos)
    except CheckpointError as exc:
        raise ArtifactError(f"LoRA adapter inside the artifact: {exc.what}", where=exc.where,
                            fix="recompile it (neuronpack compile --force)") from None
