from pathlib import Path

import pytest

from neuronpack.errors import RecipeError
from neuronpack.recipe import Recipe, load_recipe, parse_set

RECIPES = sorted((Path(__file__).parent.parent / "recipes").glob("*.toml"))


def test_recipes_exist():
    names = {p.stem for p in RECIPES}
    assert {"smollm2-135m-cpu", "tiny-test", "llama-3.1-8b-instruct-trn1", "llama-3.1-70b-instruct-trn2",
            "llama-3.2-1b-inf2", "llama-3-8b-eagle-trn1"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_loads_and_plans(path):
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    plan = recipe.bucket_plan()
    assert plan.context[-1] <= plan.max_context_length <= plan.seq_len
    assert plan.token_generation[-1] <= plan.seq_len


def test_defaults_need_no_file():
    recipe = load_recipe(model="some/model")
    assert recipe == Recipe(model={"source": "some/model"})
    assert recipe.target.batch_size == 1 and recipe.max_context_length == recipe.target.seq_len
    assert recipe.instance_for("torch") == "cpu" and recipe.instance_for("nxd") == "trn1"


def test_set_overrides_and_model_argument(tmp_path):
    recipe = load_recipe(
        Path("recipes/tiny-test.toml"),
        overrides=["target.batch_size=4", "compiler=export", "buckets.context=[32]", 'model.dtype="bfloat16"'],
        model="/models/x",
    )
    assert recipe.target.batch_size == 4 and recipe.compiler == "export"
    assert recipe.buckets.context == [32] and recipe.model.dtype == "bfloat16"
    assert recipe.model.source == "/models/x"


def test_parse_set_values():
    assert parse_set("a.b=3") == (["a", "b"], 3)
    assert parse_set("a=true") == (["a"], True)
    assert parse_set("a=[1, 2]") == (["a"], [1, 2])
    assert parse_set("compiler=export") == (["compiler"], "export")
    with pytest.raises(RecipeError, match="not KEY=VALUE"):
        parse_set("novalue")


def test_key_order_does_not_matter(tmp_path):
    a = tmp_path / "a.toml"
    b = tmp_path / "b.toml"
    a.write_text("[target]\nbatch_size = 2\nseq_len = 256\n[model]\ndtype = 'float32'\n")
    b.write_text("[model]\ndtype = 'float32'\n[target]\nseq_len = 256\nbatch_size = 2\n")
    assert load_recipe(a) == load_recipe(b)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[target]\nbatch_size = 0\n", "target.batch_size"),
        ("[target]\nbatchsize = 2\n", "unknown key 'target.batchsize'"),
        ("[target]\nbatch_size = 'four'\n", "target.batch_size"),
        ("[target]\nseq_len = 256\n[buckets]\ncontext = [512]\n", "buckets.context has 512, larger than its max"),
        ("[target]\nseq_len = 256\nmax_context_length = 512\n", "max_context_length 512 is larger"),
        ("[speculation]\ndraft = 'd'\n[lora]\nadapters = [{name = 'a', path = 'p'}]\n", "cannot be combined"),
        ("[speculation]\nlength = 4\n", 'kind "eagle" needs a draft model'),
        ("[speculation]\nkind = 'prompt_lookup'\ndraft = 'd'\n", "uses no draft model"),
        ("[speculation]\nkind = 'prompt_lookup'\nprompt_lookup_min = 4\nprompt_lookup_max = 2\n",
         "prompt_lookup_min 4 is larger than prompt_lookup_max 2"),
        ("[speculation]\ndraft = 'd'\nprompt_lookup_max = 3\n", 'apply to kind "prompt_lookup"'),
        ("[speculation]\nkind = 'ngram'\n", "speculation.kind"),
        ("[quantization]\ngranularity = 'per-channel'\n", "missing required key 'quantization.dtype'"),
        ("[quantization]\ndtype = 'int4'\n", "quantization.dtype"),
        ("[target]\ntp_degree = 6\nnodes = 4\n", "not divisible"),
        ("[target\n", "invalid TOML"),
        ("compiler = 'tvm'\n", "compiler"),
    ],
)
def test_invalid_recipes_name_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert message in info.value.one_line()
    assert str(path) in info.value.one_line()
    assert "\n" not in info.value.one_line()


def test_missing_recipe_file(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.toml")


@pytest.mark.parametrize(("given", "resolved"), [
    ({}, (5, 5)),  # vLLM's defaults for the ngram method
    ({"prompt_lookup_max": 3}, (3, 3)),  # one size given: the other takes its value
    ({"prompt_lookup_min": 2}, (2, 2)),
    ({"prompt_lookup_min": 1, "prompt_lookup_max": 4}, (1, 4)),
])
def test_prompt_lookup_sizes_resolve_as_vllm(given, resolved):
    recipe = Recipe(speculation={"kind": "prompt_lookup", "length": 3, **given})
    spec = recipe.speculation
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == resolved and spec.draft is None
    again = Recipe.model_validate(recipe.to_dict())  # the manifest's copy validates to the same recipe
    assert again == recipe
