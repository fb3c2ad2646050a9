"""LoRA in a portable artifact: the adapters travel as PEFT copies in ``lora/<name>/`` and are stacked into the
graphs' ``lora_A`` / ``lora_B`` tensors wherever a model is made from the artifact (the build, a compile worker,
the loader), so the artifact stores each adapter once, in the format users know.

``neuron_config.json`` records the layout and the slot order::

    "lora": {"max_loras": 2, "max_rank": 16, "target_modules": ["q_proj", ...],
             "adapters": [{"name": "sql", "path": "lora/sql", "rank": 8}, ...]}   # slot 1, 2, ...

Example::

    section = lora_section(recipe, request.adapter_dirs())     # for neuron_config.json (torch-free)
    attach_artifact_lora(model, config, artifact_dir)          # zero stacks + every adapter in its slot
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.artifacts.paths import member_path
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


def lora_section(lora: LoraSection | None, adapter_dirs: dict[str, Path]) -> dict[str, Any] | None:
    """neuron_config.json's ``lora`` (torch-free): the layout and each adapter's slot (list order), path and rank."""
    if lora is None:
        return None
    adapters = []
    for adapter in lora.adapters:
        info = read_adapter(adapter.name, adapter_dirs[adapter.name], target_modules=lora.target_modules,
                            max_rank=lora.max_rank)
        adapters.append({"name": adapter.name, "path": lora_path(adapter.name), "rank": info.rank})
    return {"max_loras": lora.max_loras, "max_rank": lora.max_rank, "target_modules": list(lora.target_modules),
            "adapters": adapters}


def copy_artifact_adapters(config: dict[str, Any], adapter_dirs: dict[str, Path], staging: Path) -> None:
    section = config.get("lora")
    if section:
        copy_adapters(adapter_dirs, staging, {a["name"]: a["path"] for a in section["adapters"]})


def adapter_names(config: dict[str, Any]) -> tuple[str, ...]:
    """The adapters of an artifact in slot order (slot k+1 is ``names[k]``); () without LoRA."""
    return tuple(a["name"] for a in (config.get("lora") or {}).get("adapters", ()))


def attach_artifact_lora(model, config: dict[str, Any], artifact_dir: Path) -> None:
    """Give ``model`` the artifact's LoRA stacks, every adapter in its slot (nothing without a ``lora``
    section). ArtifactError when an adapter copy is missing or no longer valid."""
    from neuronpack.errors import CheckpointError
    from neuronpack.models.lora import LoraLayout, attach_lora, fill_lora

    section = config.get("lora")
    if not section:
        return
    layout = LoraLayout.from_dict(section)
    paths = [member_path(Path(artifact_dir), a["path"]) for a in section["adapters"]]  # untrusted: stays inside
    try:
        infos = [read_adapter(a["name"], path, target_modules=layout.target_modules, max_rank=layout.max_rank)
                 for a, path in zip(section["adapters"], paths, strict=True)]
        attach_lora(model, layout)
        fill_lora(model, layout, infos)
    except CheckpointError as exc:
        raise ArtifactError(f"LoRA adapter inside the artifact: {exc.what}", where=exc.where,
                            fix="recompile it (neuronpack compile --force)") from None
