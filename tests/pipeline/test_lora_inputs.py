"""[lora] adapters through the compile pipeline, before any graph is compiled: resolution (local or cached hub id),
validation, and the key following the adapter's bytes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from neuronpack.errors import CheckpointError, RecipeError
from neuronpack.pipeline import compile_model
from tests.checkpoint.test_hub import fake_hub_cache
from tests.helpers.lora_adapters import edit_adapter_config, make_peft_adapter

RECIPE = Path("recipes/tiny-test.toml")


@pytest.fixture(scope="module")
def adapter(tiny_llama, tmp_path_factory):
    return make_peft_adapter(tiny_llama, tmp_path_factory.mktemp("lora") / "sql", rank=8)


def _dry_run(model: Path, adapter: str, root: Path, *extra: str):
    return compile_model(str(model), recipe=RECIPE, out_root=root, dry_run=True,
                         overrides=[f'lora.adapters=[{{name="sql", path="{adapter}"}}]', *extra])


def test_the_key_follows_the_adapters_bytes_not_its_location(tiny_llama, adapter, tmp_path):
    first = _dry_run(tiny_llama, str(adapter), tmp_path / "root")
    moved = shutil.copytree(adapter, tmp_path / "elsewhere" / "sql")
    assert _dry_run(tiny_llama, str(moved), tmp_path / "root").key == first.key
    edit_adapter_config(moved, lora_alpha=32)  # same tensors, another scaling
    assert _dry_run(tiny_llama, str(moved), tmp_path / "root").key != first.key
    assert first.compile_config["lora"]["adapters"] == [{"name": "sql", "path": "lora/sql", "rank": 8}]


def test_a_hub_adapter_resolves_from_the_cache_and_keys_by_content(tiny_llama, adapter, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    fake_hub_cache(cache, "someone/sql-lora", adapter)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    via_hub = _dry_run(tiny_llama, "someone/sql-lora", tmp_path / "root")
    assert via_hub.key == _dry_run(tiny_llama, str(adapter), tmp_path / "root").key


def test_a_dora_adapter_is_refused_before_anything_is_built(tiny_llama, adapter, tmp_path):
    dora = shutil.copytree(adapter, tmp_path / "dora")
    edit_adapter_config(dora, use_dora=True)
    with pytest.raises(CheckpointError, match="use_dora") as err:
        compile_model(str(tiny_llama), recipe=RECIPE, out_root=tmp_path / "root",
                      overrides=[f'lora.adapters=[{{name="sql", path="{dora}"}}]'])
    assert "lora adapter 'sql'" in err.value.where
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").rglob("neuronpack.json"))


def test_more_adapters_than_resident_slots_is_a_recipe_error(tiny_llama, adapter, tmp_path):
    two = f'lora.adapters=[{{name="a", path="{adapter}"}}, {{name="b", path="{adapter}"}}]'
    with pytest.raises(RecipeError, match="set lora.max_loras = 2"):
        compile_model(str(tiny_llama), recipe=RECIPE, out_root=tmp_path / "root", dry_run=True, overrides=[two])
