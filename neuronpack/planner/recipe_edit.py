"""A plan as recipe settings: ``--set`` lines, or written into the named recipe.

``write_recipe`` edits the recipe's TOML with tomlkit (its comments, order and layout stay; a replaced value's
line comment says it was planned), checks the result as a recipe (``load_recipe``; for vneuron also the plugin's
configuration), writes it to a temporary file beside the recipe, fsyncs it, gives it the recipe's permission bits
and renames it over the recipe (``os.replace``, atomic), then fsyncs the directory. A symlinked recipe is written
through to the file it points at. Nothing else is written: the request log and every other input are only read.

Example::

    settings = plan_settings(report, recipe)   # {"buckets.context": [96, 160, ...], ...}
    set_lines(settings)                        # ["--set buckets.context=[96,160,...]", ...]
    write_recipe(Path("recipes/mine.toml"), settings, framework="nxd")
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import tomlkit

from neuronpack.errors import RecipeError
from neuronpack.fsutil import fsync_dir
from neuronpack.planner.plan import PlanReport
from neuronpack.recipe import Recipe, load_recipe

# the recipe key each planned dimension is written to, per framework
KEYS = {"nxd": {"context": "buckets.context", "token_generation": "buckets.token_generation",
                "batch": "neuron_overrides.token_generation_batches"},
        "tnx": {"context": "buckets.context", "token_generation": "buckets.token_generation"},
        "vneuron": {"context": "buckets.context", "token_generation": "buckets.token_generation",
                    "batch": "vneuron.num_seqs_buckets"}}


def plan_settings(report: PlanReport, recipe: Recipe) -> dict[str, object]:
    """key path -> value of every recipe key the plan sets (nothing for the portable backend)."""
    keys = KEYS.get(report.framework, {})
    settings: dict[str, object] = {}
    if keys and not recipe.buckets.enabled:
        settings["buckets.enabled"] = True
    for name in report.planned_dimensions:
        settings[keys[name]] = list(getattr(report.planned, name))
    return settings


def set_lines(settings: dict[str, object]) -> list[str]:
    return [f"--set {key}={_toml_value(value)}" for key, value in settings.items()]


def write_recipe(path: Path, settings: dict[str, object], *, framework: str) -> Path:
    """Write ``settings`` into the recipe at ``path`` atomically (see the module's docstring); returns the file
    written. RecipeError when the recipe cannot be read or the result is not a valid recipe."""
    target = Path(path).resolve()
    try:
        document = tomlkit.parse(target.read_text())
    except (OSError, UnicodeDecodeError, tomlkit.exceptions.TOMLKitError) as exc:
        raise RecipeError(f"cannot edit the recipe: {exc}", where=str(path),
                          fix="pass a readable TOML recipe") from None
    for key, value in settings.items():
        _set(document, key.split("."), value, str(path))
    text = tomlkit.dumps(document)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        _check(Path(temp), framework, str(path))
        os.chmod(temp, target.stat().st_mode & 0o7777)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    fsync_dir(target.parent)
    return target


# --- private ---------------------------------------------------------------------------------------------------------
def _toml_value(value: object) -> str:
    return tomlkit.item(value).as_string().replace(" ", "")


def _set(document, path: list[str], value: object, where: str) -> None:
    node = document
    for part in path[:-1]:
        if part not in node:
            node[part] = tomlkit.table()
        node = node[part]
        if not isinstance(node, dict):
            raise RecipeError(f"{part!r} is a value, not a table", where=where, fix="fix the recipe's layout")
    item = tomlkit.item(value)
    item.comment("planned from a request log by `neuronpack buckets plan`")  # an old comment may no longer hold
    node[path[-1]] = item


def _check(path: Path, framework: str, where: str) -> None:
    """The edited recipe must load, and (vneuron) map to the plugin's configuration."""
    try:
        recipe = load_recipe(path)
        if framework == "vneuron":
            from neuronpack.backends.vneuron.config import plugin_config

            plugin_config(recipe, {})
    except RecipeError as exc:
        raise RecipeError(f"the planned recipe would not be valid: {exc.what}", where=where,
                          fix="report this; the recipe was not changed") from None
