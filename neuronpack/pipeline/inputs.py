"""Resolve everything a build reads: recipe, framework, backend, model, draft, quantized checkpoint location."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from neuronpack.backends.base import Backend
from neuronpack.buckets import BucketPlan
from neuronpack.errors import RecipeError
from neuronpack.progress import Reporter
from neuronpack.recipe_memo import RecipeView, load_recipe_memo

if TYPE_CHECKING:
    from neuronpack.recipe import Recipe


@dataclass(frozen=True)
class ResolvedInputs:
    recipe: Recipe | RecipeView  # a view when the memo knows this recipe (BuildPlan.for_build validates it)
    recipe_path: Path | None
    framework: str
    framework_reason: str
    backend: Backend
    model_dir: Path  # the checkpoint as given (before quantization)
    draft_dir: Path | None  # the speculation draft as given (before EAGLE conversion)
    plan: BucketPlan
    lora_dirs: Mapping[str, Path] = field(default_factory=dict)  # adapter name -> local dir (validated)


def resolve_inputs(
    model: str | None,
    *,
    recipe_path: Path | None,
    overrides: Sequence[str],
    framework: str | None,
    reporter: Reporter,
) -> ResolvedInputs:
    from neuronpack.backends.select import choose_framework, get_backend
    from neuronpack.checkpoint import resolve_model

    recipe = load_recipe_memo(recipe_path, overrides=list(overrides), model=model)
    if not recipe.model.source:
        raise RecipeError(
            "no model to compile",
            where=str(recipe_path) if recipe_path else "command line",
            fix="pass MODEL (a checkpoint directory or hub id) or set [model] source in the recipe",
        )
    choice = choose_framework(framework or recipe.target.framework)
    backend = get_backend(choice.name)
    source = recipe.model.source
    if recipe.model.revision and "@" not in source and not Path(source).exists():
        source = f"{source}@{recipe.model.revision}"
    model_dir = resolve_model(source, reporter=reporter)
    spec = recipe.speculation
    draft_dir = resolve_model(spec.draft, reporter=reporter) if spec and spec.draft else None
    lora_dirs = resolve_lora_adapters(recipe, reporter)
    return ResolvedInputs(
        recipe=recipe,
        recipe_path=recipe_path,
        framework=choice.name,
        framework_reason=choice.reason,
        backend=backend,
        model_dir=model_dir,
        draft_dir=draft_dir,
        plan=recipe.bucket_plan(),
        lora_dirs=lora_dirs,
    )


def resolve_lora_adapters(recipe: Recipe | RecipeView, reporter: Reporter) -> dict[str, Path]:
    """Each ``[lora]`` adapter resolved like MODEL (a local directory or a cached hub id) and validated against the
    recipe (PEFT LoRA options the graphs can apply, target_modules, max_rank): adapter name -> directory."""
    if recipe.lora is None:
        return {}
    from neuronpack.checkpoint.lora import read_adapter, resolve_adapter

    dirs = {}
    for adapter in recipe.lora.adapters:
        path = resolve_adapter(adapter.path, reporter=reporter)
        read_adapter(adapter.name, path, target_modules=recipe.lora.target_modules, max_rank=recipe.lora.max_rank)
        dirs[adapter.name] = path
    return dirs
