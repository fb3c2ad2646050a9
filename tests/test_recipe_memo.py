"""recipe_memo: a recipe input validated once answers later as a RecipeView that reads like the Recipe, keys like it,
and never stands in for a recipe that was not validated (bad, changed, or validated by another validator)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from neuronpack.artifacts.key import compile_inputs
from neuronpack.backends.select import get_backend
from neuronpack.errors import RecipeError
from neuronpack.recipe import Recipe, load_recipe
from neuronpack.recipe_memo import RecipeView, full_recipe, load_recipe_memo, memo_dir

RECIPES = sorted((Path(__file__).parent.parent / "recipes").glob("*.toml"))


@pytest.fixture(autouse=True)
def _own_memo(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURONPACK_CACHE_DIR", str(tmp_path / "cache"))


def _outcome(fn, *args):
    try:
        return fn(*args)
    except RecipeError as exc:
        return exc.one_line()


def _twice(path: Path | None = None, **kwargs) -> tuple[Recipe, RecipeView]:
    first = load_recipe_memo(path, **kwargs)
    second = load_recipe_memo(path, **kwargs)
    assert isinstance(first, Recipe) and isinstance(second, RecipeView)
    return first, second


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_a_view_reads_and_keys_like_the_recipe(path):
    recipe, view = _twice(path, model="/models/x")
    assert view.to_dict() == recipe.to_dict()
    assert view.bucket_plan() == recipe.bucket_plan() and view.max_context_length == recipe.max_context_length
    for framework in ("torch", "nxd", "tnx"):
        assert view.instance_for(framework) == recipe.instance_for(framework)
        assert compile_inputs(view, view.bucket_plan(), framework) == compile_inputs(recipe, recipe.bucket_plan(),
                                                                                    framework)
    for name in ("nxd", "tnx", "torch"):  # what the key's "target" is computed from (or the error it raises)
        assert _outcome(get_backend(name).target, view) == _outcome(get_backend(name).target, recipe)
    assert view.model.source == "/models/x" and view.target.seq_len == recipe.target.seq_len
    assert view.neuron_overrides == recipe.neuron_overrides
    for section in ("quantization", "speculation", "lora"):
        assert (getattr(view, section) is None) == (getattr(recipe, section) is None)
    if recipe.lora is not None:
        assert [(a.name, a.path) for a in view.lora.adapters] == [(a.name, a.path) for a in recipe.lora.adapters]
        assert view.lora.target_modules == recipe.lora.target_modules
    if recipe.speculation is not None:
        assert (view.speculation.kind, view.speculation.draft) == (recipe.speculation.kind, recipe.speculation.draft)
    if recipe.quantization is not None:
        assert view.quantization.skip == recipe.quantization.skip
    assert full_recipe(view) == recipe == load_recipe(path, model="/models/x")


def test_a_view_is_read_only():
    _, view = _twice(Path("recipes/tiny-test.toml"), model="/m")
    data = view.to_dict()
    data["target"]["seq_len"] = 1
    view.neuron_overrides["x"] = 1
    assert view.target.seq_len == 128 and view.to_dict()["target"]["seq_len"] == 128 and "x" not in view.to_dict()
    with pytest.raises(AttributeError):
        view.compiler = "export"
    with pytest.raises(AttributeError, match="no field 'nope'"):
        _ = view.target.nope


def test_a_bad_recipe_is_refused_every_time_and_never_stored(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[target]\nbatch_size = 0\n")
    for _ in range(2):
        with pytest.raises(RecipeError, match="target.batch_size") as info:
            load_recipe_memo(path, model="/m")
        assert str(path) in info.value.where
    assert not memo_dir().exists() or not list(memo_dir().iterdir())


def test_a_changed_input_is_validated_again(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("[target]\nseq_len = 256\n")
    _twice(path, model="/m")
    path.write_text("[target]\nseq_len = 256\nbatch_size = 0\n")  # now invalid: must not come from the memo
    with pytest.raises(RecipeError, match="batch_size"):
        load_recipe_memo(path, model="/m")
    path.write_text("[target]\nseq_len = 512\n")
    recipe = load_recipe_memo(path, model="/m")
    assert isinstance(recipe, Recipe) and recipe.target.seq_len == 512
    for changed in ({"model": "/other"}, {"model": "/m", "overrides": ["target.batch_size=2"]}):
        recipe = load_recipe_memo(path, **{"overrides": (), **changed})
        assert isinstance(recipe, Recipe)  # another input: validated, not the stored one


def test_another_validator_is_a_new_entry(monkeypatch):
    _twice(model="/m")
    monkeypatch.setattr("neuronpack.recipe_memo.__version__", "99.0")  # an upgraded neuronpack
    assert isinstance(load_recipe_memo(model="/m"), Recipe)
    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes",  # an edited validator
                        lambda self: read_bytes(self) + (b"# edited" if self.name == "recipe.py" else b""))
    assert isinstance(load_recipe_memo(model="/m"), Recipe)


def test_a_corrupt_or_unwritable_memo_only_costs_a_validation(monkeypatch, tmp_path):
    _twice(model="/m")
    (entry,) = memo_dir().iterdir()
    for garbage in ("{", "[]", json.dumps({"memo_schema": 1, "recipe": 3, "sections": []})):
        entry.write_text(garbage)
        assert isinstance(load_recipe_memo(model="/m"), Recipe)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory should be")
    monkeypatch.setenv("NEURONPACK_CACHE_DIR", str(blocked))
    assert isinstance(load_recipe_memo(model="/m"), Recipe) and isinstance(load_recipe_memo(model="/m"), Recipe)


def test_a_toml_date_is_validated_without_the_memo(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("[neuron_overrides]\nwhen = 2026-12-01\n")
    assert isinstance(load_recipe_memo(path, model="/m"), Recipe) and isinstance(load_recipe_memo(path, model="/m"),
                                                                                Recipe)


def test_the_least_recently_used_entries_are_pruned(monkeypatch):
    monkeypatch.setattr("neuronpack.recipe_memo.MEMO_ENTRIES", 2)
    tick = 0.05  # file times are coarse (a few ms): space the uses apart
    _twice(model="/a")
    time.sleep(tick)
    _twice(model="/b")
    time.sleep(tick)
    assert isinstance(load_recipe_memo(model="/a"), RecipeView)  # /a used last: /b is the oldest now
    time.sleep(tick)
    load_recipe_memo(model="/c")  # a third entry: /b goes
    assert len(list(memo_dir().iterdir())) == 2
    assert isinstance(load_recipe_memo(model="/a"), RecipeView) and isinstance(load_recipe_memo(model="/c"), RecipeView)
    assert isinstance(load_recipe_memo(model="/b"), Recipe)


def test_an_edited_entry_is_caught_before_a_build_and_removed():
    _, view = _twice(Path("recipes/tiny-test.toml"), model="/m")
    (entry,) = memo_dir().iterdir()
    data = json.loads(entry.read_text())
    data["recipe"]["target"]["seq_len"] = 4096
    entry.write_text(json.dumps(data))
    edited = load_recipe_memo(Path("recipes/tiny-test.toml"), model="/m")
    assert edited.target.seq_len == 4096  # what the memo says (a key from it names no artifact of this recipe)
    with pytest.raises(RecipeError, match="remembered validation"):
        full_recipe(edited)
    assert not entry.exists()
    assert isinstance(load_recipe_memo(Path("recipes/tiny-test.toml"), model="/m"), Recipe)
