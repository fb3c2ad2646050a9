"""What a recipe says before it is validated: the TOML file, ``--set`` overrides and MODEL merged into one dict.

Plain TOML and dicts, no pydantic: ``neuronpack.recipe`` validates this data, and ``neuronpack.recipe_memo`` keys
validated recipes by it, so that a cache-hit compile does not import the validator.

Example::

    data, where = read_recipe_input(Path("recipes/tiny-test.toml"), overrides=["target.batch_size=4"], model="./m")
    data["target"]["batch_size"]   # 4
    where                          # "recipes/tiny-test.toml with --set target.batch_size=4" (for error messages)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neuronpack.errors import RecipeError
from neuronpack.text import control_character_problem, strings_with_paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def parse_set(assignment: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` -> (["a", "b", "c"], value). VALUE is read as TOML (numbers, booleans, [lists], "strings");
    anything that is not valid TOML is taken as a bare string (``compiler=export``). A control character (a newline:
    TOML would read a second key, or a truncated value) is refused, typed or given as a TOML escape."""
    key, sep, raw = assignment.partition("=")
    path = [p.strip() for p in key.strip().split(".")]
    if not sep or not all(path):
        raise RecipeError(
            f"--set {assignment!r} is not KEY=VALUE", where="--set", fix="write it like --set target.batch_size=4"
        )
    _refuse_control_characters(assignment)
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    except RecursionError:
        raise RecipeError(f"--set {key.strip()}=...: the value is nested too deeply", where="--set",
                          fix="give a flat value like 4, true, [128, 512] or \"text\"") from None
    for _, text in strings_with_paths(value):
        _refuse_control_characters(assignment, text)
    return path, value


def _refuse_control_characters(assignment: str, text: str | None = None) -> None:
    problem = control_character_problem(assignment if text is None else text)
    if problem is not None:
        key = assignment.partition("=")[0].strip()
        raise RecipeError(f"--set {key!r}: the {'value' if text is not None else 'assignment'} {problem}",
                          where="--set", fix="give one line of plain text, without control characters")


def _apply_set(data: dict[str, Any], path: list[str], value: Any, assignment: str) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise RecipeError(
                f"--set {assignment!r}: {part!r} is a value, not a section", where="--set", fix="check the key path"
            )
        node = child
    node[path[-1]] = value


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise RecipeError("recipe file not found", where=str(path), fix="pass an existing file to --recipe") from None
    except IsADirectoryError:
        raise RecipeError("recipe path is a directory", where=str(path), fix="pass a .toml file") from None
    except UnicodeDecodeError:
        raise RecipeError("recipe is not UTF-8 text", where=str(path), fix="save it as UTF-8 TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"invalid TOML: {exc}", where=str(path), fix="fix the syntax") from None
    except RecursionError:
        raise RecipeError("invalid TOML: nested too deeply", where=str(path), fix="flatten the arrays/tables") from None
    except OSError as exc:
        raise RecipeError(f"cannot read recipe: {exc.strerror or exc}", where=str(path),
                          fix="pass a readable .toml file to --recipe") from None


def read_recipe_input(
    path: Path | None = None, *, overrides: Sequence[str] = (), model: str | None = None
) -> tuple[dict[str, Any], str]:
    """(the recipe's data with ``overrides`` applied and ``model`` as ``model.source``, where it came from). Raises
    RecipeError for an unreadable file, bad TOML or a malformed ``--set``; the values are not checked here."""
    data: dict[str, Any] = _read_toml(Path(path)) if path is not None else {}
    for assignment in overrides:
        key_path, value = parse_set(assignment)
        _apply_set(data, key_path, value, assignment)
    if model is not None:
        data.setdefault("model", {})
        if not isinstance(data["model"], dict):
            raise RecipeError("'model' must be a table", where=str(path), fix="write it as [model]")
        data["model"]["source"] = str(model)
    where = str(path) if path is not None else "recipe defaults"
    if overrides:
        where += " with --set " + ", ".join(overrides)
    _check_text(data, where)
    return data, where


def _check_text(data: dict[str, Any], where: str) -> None:
    """Every string of the recipe (names, labels, sources, keys) goes into the manifest: no control characters."""
    for key_path, text in strings_with_paths(data):
        problem = control_character_problem(text)
        if problem is not None:
            raise RecipeError(f"{'.'.join(key_path) or 'recipe'} {problem}", where=where,
                              fix="give one line of plain text, without control characters")
