"""Validated recipes remembered by their input, so that a cache-hit compile needs no pydantic (~0.1 s of start-up).

``load_recipe_memo`` reads the recipe's input (``recipe_input``: TOML, ``--set``, MODEL). The first time an input is
seen it is validated (``neuronpack.recipe``, pydantic) and the validated recipe, as ``Recipe.to_dict()``, is stored
in ``$NEURONPACK_CACHE_DIR/recipes/<digest>.json``, the digest covering the input and the validator itself (this
neuronpack's version, the bytes of ``recipe.py``, the installed pydantic). Later the same input gives a
``RecipeView`` of the stored data: attribute access like a ``Recipe`` (sections, ``bucket_plan()``, ``to_dict()``),
enough to resolve and key a build. Only successful validations are stored, so a bad recipe is always validated and
refused with its usual error; a changed file, override, model or validator is a new digest.

A build (a cache miss, ``--dry-run``) needs the real ``Recipe``: ``full_recipe`` validates the view's input again
(and refuses a view that differs from it). A store that cannot be written or read is never fatal (the recipe is
validated, as without the memo). Like the digest cache, the store is trusted: an entry edited by hand could key a
cache hit wrongly, as an edited ``digests.json`` could.

Example::

    recipe = load_recipe_memo(Path("recipes/tiny-test.toml"), overrides=["compiler=export"], model="./m")
    recipe.target.seq_len, recipe.bucket_plan()    # the same answers for a Recipe and a RecipeView
    full_recipe(recipe)                            # always a validated Recipe
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack import __version__
from neuronpack.digest import cache_dir
from neuronpack.errors import RecipeError
from neuronpack.fsutil import write_text_atomic
from neuronpack.recipe_input import read_recipe_input
from neuronpack.recipe_methods import RecipeMethods

if TYPE_CHECKING:
    from neuronpack.recipe import Recipe

MEMO_SCHEMA = 1
MEMO_ENTRIES = 256  # entries kept (~2 KB each): the least recently used go when a new one is written


class _Section:
    """Read-only attribute access over one section of a stored recipe; ``sections`` names the fields (dotted paths,
    ``[]`` for a list of sections) that are sections themselves."""

    __slots__ = ("_data", "_path", "_sections")

    def __init__(self, data: dict[str, Any], sections: frozenset[str], path: str = "") -> None:
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_sections", sections)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        try:
            value = self._data[name]
        except KeyError:
            raise AttributeError(f"recipe section {self._path or 'recipe'!r} has no field {name!r}") from None
        path = f"{self._path}{name}"
        if value is not None and path in self._sections:
            return _Section(value, self._sections, path + ".")
        if isinstance(value, list) and f"{path}[]" in self._sections:
            return [_Section(v, self._sections, path + "[].") for v in value]
        return copy.deepcopy(value) if isinstance(value, dict | list) else value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a stored recipe is read-only")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._data!r})"


class RecipeView(RecipeMethods, _Section):
    """A validated recipe read back from the memo: a ``Recipe`` for reading, without pydantic."""

    __slots__ = ("entry", "input", "where")

    def __init__(self, dumped: dict[str, Any], sections: frozenset[str], input_data: dict[str, Any], where: str,
                 entry: Path | None = None):
        super().__init__(dumped, sections)
        object.__setattr__(self, "input", input_data)  # what read_recipe_input gave: validated again by full_recipe
        object.__setattr__(self, "where", where)
        object.__setattr__(self, "entry", entry)  # the memo file it was read from

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._data)


def load_recipe_memo(
    path: Path | None = None, *, overrides: Sequence[str] = (), model: str | None = None
) -> Recipe | RecipeView:
    """``load_recipe`` that answers from the memo when this exact input was validated before (see the module)."""
    data, where = read_recipe_input(path, overrides=overrides, model=model)
    digest = _input_digest(data)
    if digest is not None and (entry := _read_entry(digest)) is not None:
        return RecipeView(entry["recipe"], frozenset(entry["sections"]), data, where, memo_dir() / f"{digest}.json")
    from neuronpack.recipe import validate_recipe_data

    recipe = validate_recipe_data(data, where)
    if digest is not None:
        _write_entry(digest, recipe)
    return recipe


def full_recipe(recipe: Recipe | RecipeView) -> Recipe:
    """The validated ``Recipe`` (a view's input is validated again: a build never runs on stored data). A view that
    does not read like it (its memo file was edited) was keyed wrongly: RecipeError, and the entry is removed."""
    if not isinstance(recipe, RecipeView):
        return recipe
    from neuronpack.recipe import validate_recipe_data

    validated = validate_recipe_data(recipe.input, recipe.where)
    if validated.to_dict() != recipe.to_dict():
        if recipe.entry is not None:
            recipe.entry.unlink(missing_ok=True)
        raise RecipeError("the remembered validation of this recipe differs from the recipe (edited by hand?)",
                          where=str(recipe.entry), fix="run the command again: the stale entry was removed")
    return validated


def memo_dir() -> Path:
    return cache_dir() / "recipes"


def _input_digest(data: dict[str, Any]) -> str | None:
    """sha256 of the input and the validator, or None when the input is not plain JSON (a TOML date, say)."""
    try:  # no default= conversion: a date must not hash like the string of the same text
        text = json.dumps({"memo_schema": MEMO_SCHEMA, "input": data, "validator": _validator_identity()},
                          sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def _validator_identity() -> dict[str, Any]:
    """What decides whether an input is valid and what it validates to: neuronpack's version, the bytes of
    recipe.py, and the installed pydantic (its files' size and mtime, found without importing it)."""
    source = Path(__file__).with_name("recipe.py").read_bytes()
    ident: dict[str, Any] = {"neuronpack": __version__, "recipe.py": hashlib.sha256(source).hexdigest()}
    for package in ("pydantic", "pydantic_core"):
        spec = importlib.util.find_spec(package)
        origin = spec.origin if spec is not None else None
        st = os.stat(origin) if origin else None
        ident[package] = [origin, st.st_size, st.st_mtime_ns] if st else None
    return ident


def _read_entry(digest: str) -> dict[str, Any] | None:
    path = memo_dir() / f"{digest}.json"
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(entry, dict) and entry.get("memo_schema") == MEMO_SCHEMA and isinstance(entry.get("recipe"), dict)
          and isinstance(entry.get("sections"), list) and all(isinstance(s, str) for s in entry["sections"]))
    if ok:
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: kept when old entries are pruned
    return entry if ok else None


def _write_entry(digest: str, recipe: Recipe) -> None:
    entry = {"memo_schema": MEMO_SCHEMA, "recipe": recipe.to_dict(), "sections": sorted(_section_paths(recipe))}
    try:
        write_text_atomic(memo_dir() / f"{digest}.json", json.dumps(entry, sort_keys=True))
        _prune(MEMO_ENTRIES)
    except OSError:
        pass  # a read-only or full cache: the next run validates again


def _prune(keep: int) -> None:
    """Remove all but the ``keep`` most recently used entries."""
    entries = []
    for path in memo_dir().glob("*.json"):
        with contextlib.suppress(OSError):
            entries.append((path.stat().st_mtime_ns, path))
    for _, path in sorted(entries, reverse=True)[keep:]:
        path.unlink(missing_ok=True)


def _section_paths(model: Any, prefix: str = "") -> set[str]:
    """Dotted paths of the fields of a pydantic ``model`` that are models themselves (``a.b``; ``a[]`` for lists)."""
    from pydantic import BaseModel

    out: set[str] = set()
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out |= {prefix + name, *_section_paths(value, f"{prefix}{name}.")}
        elif isinstance(value, list | tuple) and any(isinstance(v, BaseModel) for v in value):
            out.add(f"{prefix}{name}[]")
            for item in value:
                out |= _section_paths(item, f"{prefix}{name}[].")
    return out
