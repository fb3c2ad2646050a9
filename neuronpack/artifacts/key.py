"""The artifact key: what makes two builds the same.

sha256 of the canonical JSON (sorted keys, no whitespace) of every input that can change the compiled result:
the key's own schema, framework and toolchain versions, target, resolved compile configuration (recipe minus cosmetic
fields, plus the bucket plan), the model config minus cosmetic keys, and weight identity (names, shapes, dtypes and
content digests, cached by file stat so a cache-hit check never re-reads unchanged weights).

Torch-free: this runs on every `neuronpack compile`, including cache hits.

Example::

    inputs = key_inputs(framework="torch", versions=..., target=..., recipe=recipe, plan=plan, model_dir=path,
                        draft_dir=None)
    key = compute_key(inputs)    # 64 hex chars
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.buckets import BucketPlan
from neuronpack.digest import file_sha256, sha256_json

if TYPE_CHECKING:  # a Recipe or the memo's RecipeView (neuronpack.recipe_memo): a cache hit imports no pydantic
    from neuronpack.recipe import LoraSection, Recipe

KEY_SCHEMA = 1

# Keys of config.json that do not change what is compiled.
COSMETIC_CONFIG_KEYS = frozenset(
    {"_name_or_path", "transformers_version", "_commit_hash", "_attn_implementation_autoset", "_attn_implementation"}
)
# Recipe fields that do not change what is compiled (where the model came from, labels).
COSMETIC_RECIPE_FIELDS = ("name", "description")
AUX_FILES_IN_KEY = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
                    "special_tokens_map.json", "tokenizer.model")


def model_identity(model_dir: Path) -> dict[str, Any]:
    """A checkpoint by content: config.json minus cosmetic keys, tensor names/dtypes/shapes, and a digest of every
    weight file (relative name -> sha256). Renaming or moving the directory does not change it."""
    from neuronpack.checkpoint import open_checkpoint

    ckpt = open_checkpoint(Path(model_dir))
    return {
        "config": {k: v for k, v in ckpt.config.items() if k not in COSMETIC_CONFIG_KEYS},
        "weights": {
            "tensors": ckpt.weight_identity(),
            "files": {str(Path(f).relative_to(ckpt.root)): file_sha256(Path(f)) for f in ckpt.files},
        },
    }


def aux_files_identity(model_dir: Path) -> dict[str, str]:
    return {
        name: file_sha256(Path(model_dir) / name)
        for name in AUX_FILES_IN_KEY
        if (Path(model_dir) / name).is_file()
    }


def compile_inputs(recipe: Recipe, plan: BucketPlan, framework: str) -> dict[str, Any]:
    """The resolved compile configuration: the recipe minus cosmetic fields and the model's location."""
    data = recipe.to_dict()
    for name in COSMETIC_RECIPE_FIELDS:
        data.pop(name, None)
    data["model"] = {k: v for k, v in data["model"].items() if k not in ("source", "revision")}
    data["target"]["framework"] = framework
    data["target"]["instance"] = recipe.instance_for(framework)
    if data.get("speculation"):
        data["speculation"] = {k: v for k, v in data["speculation"].items() if k != "draft"}
    if data.get("lora"):
        data["lora"]["adapters"] = [a["name"] for a in data["lora"]["adapters"]]
    data["buckets"] = plan.to_dict()
    return data


def lora_identity(lora: LoraSection, dirs: Mapping[str, Path] | None = None) -> dict[str, Any]:
    """adapter name -> its files by content: the resolved directory in ``dirs`` (a hub id's snapshot), else the
    recipe's path when it is a directory, else the reference as written."""
    out: dict[str, Any] = {}
    for a in lora.adapters:
        path = Path((dirs or {}).get(a.name) or a.path)
        out[a.name] = directory_identity(path) if path.is_dir() else a.path
    return out


def key_inputs(
    *,
    framework: str,
    versions: dict[str, str],
    target: dict[str, Any],
    recipe: Recipe,
    plan: BucketPlan,
    model_dir: Path,
    draft_dir: Path | None = None,
    lora_dirs: Mapping[str, Path] | None = None,
) -> dict[str, Any]:
    """Every input of the key, in full (also recorded in the manifest): toolchain, target, the compile
    configuration, and every checkpoint the build reads by content (the model, the speculation draft as given, the
    LoRA adapters: ``lora_dirs`` maps each name to its resolved directory, whose every byte is keyed)."""
    inputs: dict[str, Any] = {
        "key_schema": KEY_SCHEMA,
        "framework": framework,
        "versions": dict(sorted(versions.items())),
        "target": target,
        "compile": compile_inputs(recipe, plan, framework),
        "model": model_identity(model_dir),
        "aux_files": aux_files_identity(model_dir),
    }
    if draft_dir is not None:
        inputs["draft"] = model_identity(draft_dir)
    if recipe.lora:
        inputs["lora"] = lora_identity(recipe.lora, lora_dirs)
    return inputs


def toolchain_versions(backend: Any) -> dict[str, str]:
    """neuronpack's own version plus the backend's toolchain versions: both go into the key and are checked at load."""
    from neuronpack import __version__

    return {"neuronpack": __version__, **backend.versions()}


def compute_key(inputs: dict[str, Any]) -> str:
    return sha256_json(inputs)


def directory_identity(path: Path) -> dict[str, str]:
    """relative file name -> sha256 for every file below ``path`` (LoRA adapters and other small inputs)."""
    root = Path(path)
    return {str(p.relative_to(root)): file_sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}
