"""The key: stable under cosmetic changes, sensitive to everything that changes the compiled result."""

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from neuronpack.artifacts.key import compute_key, key_inputs
from neuronpack.digest import file_sha256
from neuronpack.recipe import load_recipe

VERSIONS = {"neuronpack": "0.1.0", "torch": "2.13.0"}
TARGET = {"instance": "cpu", "device": "cpu", "cpu_capability": "AVX2", "cxx": "g++ 12.2.0"}


def key_of(model_dir: Path, recipe=None, versions=VERSIONS, target=TARGET, framework="torch") -> str:
    recipe = recipe or load_recipe(Path("recipes/tiny-test.toml"))
    inputs = key_inputs(framework=framework, versions=versions, target=target, recipe=recipe,
                        plan=recipe.bucket_plan(), model_dir=model_dir)
    return compute_key(inputs)


@pytest.fixture
def model(tmp_path, tiny_llama):
    dst = tmp_path / "model"
    shutil.copytree(tiny_llama, dst)
    return dst


def test_key_is_stable_and_hex(model):
    assert key_of(model) == key_of(model)
    assert len(key_of(model)) == 64 and all(c in "0123456789abcdef" for c in key_of(model))


def test_renaming_the_model_directory_keeps_the_key(model, tmp_path):
    before = key_of(model)
    moved = tmp_path / "renamed-elsewhere"
    shutil.move(model, moved)
    assert key_of(moved) == before


def test_cosmetic_config_keys_do_not_change_the_key(model):
    before = key_of(model)
    config = json.loads((model / "config.json").read_text())
    config["_name_or_path"] = "/somewhere/else"
    config["transformers_version"] = "9.9.9"
    (model / "config.json").write_text(json.dumps(config))
    assert key_of(model) == before


def test_changing_one_weight_value_changes_the_key(model):
    before = key_of(model)
    tensors = load_file(model / "model.safetensors")
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1.0
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    assert key_of(model) != before


def test_key_inputs_sensitivity(model):
    base = key_of(model)
    assert key_of(model, versions={**VERSIONS, "torch": "2.14.0"}) != base
    assert key_of(model, versions={**VERSIONS, "neuronx-cc": "2.18"}) != base
    assert key_of(model, target={**TARGET, "cxx": "g++ 13.1.0"}) != base
    assert key_of(model, target={**TARGET, "cpu_capability": "AVX512"}) != base
    assert key_of(model, framework="nxd") != base
    bucket = load_recipe(Path("recipes/tiny-test.toml"), overrides=["buckets.context=[32, 64]"])
    assert key_of(model, recipe=bucket) != base
    dtype = load_recipe(Path("recipes/tiny-test.toml"), overrides=['model.dtype="bfloat16"'])
    assert key_of(model, recipe=dtype) != base
    config = json.loads((model / "config.json").read_text())
    config["rms_norm_eps"] = 1e-6
    (model / "config.json").write_text(json.dumps(config))
    assert key_of(model) != base


def test_recipe_labels_and_model_source_do_not_change_the_key(model):
    base = key_of(model)
    relabeled = load_recipe(Path("recipes/tiny-test.toml"), overrides=['name="other"', 'description="x"'],
                            model="/another/path")
    assert key_of(model, recipe=relabeled) == base


def test_digest_cache_answers_without_rereading(model, monkeypatch):
    weights = model / "model.safetensors"
    first = file_sha256(weights)
    import neuronpack.digest as digest

    def fail(_path):
        raise AssertionError("re-read an unchanged file")

    monkeypatch.setattr(digest, "sha256_stream", fail)
    assert file_sha256(weights) == first


def test_lora_adapters_are_keyed_by_content(model, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v1")
    recipe = load_recipe(Path("recipes/tiny-test.toml"),
                         overrides=[f'lora.adapters=[{{name="sql", path="{adapter}"}}]'])
    before = key_of(model, recipe)
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v2")
    assert key_of(model, recipe) != before
