"""Fuzz the recipe loader and the ``--set`` parser: any text, any key path and any TOML value either loads a Recipe
whose bucket plan builds, or raises RecipeError (one line)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from neuronpack.errors import RecipeError
from neuronpack.recipe import Recipe, load_recipe, parse_set

from . import assert_one_line, fuzz_settings

RECIPES = sorted((Path(__file__).parents[2] / "recipes").glob("*.toml"))
# Every key a recipe knows (plus a few it does not), so generated overrides reach the validators.
KEYS = [
    "name", "description", "compiler", "model", "model.source", "model.revision", "model.dtype",
    "target", "target.framework", "target.instance", "target.tp_degree", "target.batch_size", "target.seq_len",
    "target.max_context_length", "target.nodes", "buckets", "buckets.enabled", "buckets.context",
    "buckets.token_generation", "sampling.on_device", "sampling.global_topk", "sampling.top_k", "sampling.top_p",
    "sampling.temperature", "quantization", "quantization.dtype", "quantization.granularity", "quantization.skip",
    "quantization.include_lm_head", "speculation", "speculation.kind", "speculation.draft", "speculation.length",
    "lora", "lora.adapters", "lora.max_rank", "lora.max_loras", "lora.target_modules", "neuron_overrides",
    "neuron_overrides.a.b", "target.seq_len.x", "unknown", "buckets.context.0",
]
toml_scalars = st.sampled_from([
    "0", "-1", "1", "2", "4", "16", "64", "128", "2048", "1_048_577", "1e400", "nan", "inf", "0.5", "1.0", "true",
    "false", '"int8"', '"fp8"', '"torch"', '"auto"', '"export"', '"eagle"', '"cpu"', '"x"', "''", "1979-05-27",
    "{}", '{ draft = "d" }', '{ dtype = "int8" }', '[{ name = "a", path = "p" }]', "[]", "[0]", "[64, 32]",
    "[1.5]", '["a"]', "[[1]]", "export", "", "=", "[", '"unterminated',
])
toml_values = toml_scalars | st.text(max_size=12) | st.lists(st.integers(-3, 5000), max_size=4).map(str)
assignments = st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS) | st.text(max_size=10), toml_values)


def load(**kwargs) -> Recipe | None:
    try:
        recipe = load_recipe(**kwargs)
    except RecipeError as exc:
        assert_one_line(exc)
        return None
    plan = recipe.bucket_plan()  # a validated recipe always plans
    assert list(plan.context) == sorted(plan.context) and plan.context[-1] <= plan.max_context_length
    assert list(plan.token_generation) == sorted(plan.token_generation) and plan.token_generation[-1] <= plan.seq_len
    return recipe


@fuzz_settings(400)
@given(assignment=st.text(max_size=40) | assignments)
@example(assignment="x=" + "[" * 5000)  # regression: RecursionError escaped from tomllib
def test_parse_set_never_crashes(assignment):
    try:
        path, _value = parse_set(assignment)
    except RecipeError as exc:
        assert_one_line(exc)
        return
    assert path and all(path)


@fuzz_settings(300)
@given(overrides=st.lists(assignments, max_size=5), base=st.sampled_from([None, *RECIPES]),
       model=st.none() | st.text(max_size=8))
def test_overrides_load_or_refuse(overrides, base, model):
    load(path=base, overrides=overrides, model=model)


@fuzz_settings(300)
@given(text=st.text(max_size=200) | st.lists(assignments, max_size=8).map("\n".join))
@example(text="a = " + "[" * 5000)  # regression: RecursionError escaped from tomllib
def test_recipe_file_text(tmp_path, text):
    path = tmp_path / "r.toml"
    path.write_text(text)
    load(path=path)


@fuzz_settings(100)
@given(blob=st.binary(max_size=100))
def test_recipe_file_bytes(tmp_path, blob):
    path = tmp_path / "r.toml"
    path.write_bytes(blob)
    load(path=path)


@fuzz_settings(200)
@given(recipe=st.sampled_from(RECIPES), cut=st.integers(0, 4000))
def test_truncated_real_recipes(tmp_path, recipe, cut):
    path = tmp_path / "r.toml"
    path.write_text(recipe.read_text()[:cut])
    load(path=path)


def test_recipe_path_under_a_file_is_refused(tmp_path):
    """Regression: NotADirectoryError (an OSError other than not-found) escaped as a traceback."""
    (tmp_path / "file").write_text("")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "file" / "recipe.toml")
    assert "cannot read recipe" in info.value.what
    assert_one_line(info.value)


@pytest.mark.parametrize("text", ["a = " + "[" * 5000, "x = {" * 3000])
def test_deeply_nested_toml_is_refused(tmp_path, text):
    """Regression: RecursionError from tomllib escaped as a traceback."""
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(RecipeError, match="nested too deeply"):
        load_recipe(path)
    with pytest.raises(RecipeError, match="nested too deeply"):
        parse_set("x=" + text[4:])
