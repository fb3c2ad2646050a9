"""PEFT adapters read without PEFT: what is accepted, and one clear line for everything the graphs cannot apply."""

from __future__ import annotations

import math
import shutil

import pytest

from neuronpack.checkpoint.lora import adapter_tensors, read_adapter, resolve_adapter
from neuronpack.errors import CheckpointError, ModelNotFoundError
from tests.helpers.lora_adapters import ATTENTION, edit_adapter_config, make_peft_adapter

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def adapter(tiny_llama, tmp_path_factory):
    return make_peft_adapter(tiny_llama, tmp_path_factory.mktemp("lora") / "sql", rank=8, alpha=16)


def _copy(adapter, tmp_path):
    return shutil.copytree(adapter, tmp_path / "copy")


def test_a_peft_adapter_reads_with_its_rank_scaling_and_targets(adapter):
    info = read_adapter("sql", adapter, target_modules=ATTENTION, max_rank=16)
    assert (info.rank, info.alpha, info.scaling) == (8, 16.0, 2.0)
    assert info.modules == tuple(sorted(ATTENTION)) and len(info.targets) == 2 * 4  # 2 layers x q/k/v/o
    assert info.targets[(0, "q_proj")] == ((8, 64), (64, 8))
    assert info.targets[(1, "k_proj")] == ((8, 64), (32, 8))  # 2 KV heads x head_dim 16
    a, b = adapter_tensors(info)[(1, "o_proj")]
    assert a.shape == (8, 64) and b.shape == (64, 8) and b.abs().sum() > 0


def test_rslora_scales_by_the_square_root_of_the_rank(adapter, tmp_path):
    copy = _copy(adapter, tmp_path)
    edit_adapter_config(copy, use_rslora=True)
    assert read_adapter("x", copy, target_modules=ATTENTION, max_rank=16).scaling == pytest.approx(16 / math.sqrt(8))


@pytest.mark.parametrize(("change", "message"), [
    ({"use_dora": True}, "use_dora"),
    ({"bias": "all"}, "bias"),
    ({"fan_in_fan_out": True}, "fan_in_fan_out"),
    ({"rank_pattern": {"q_proj": 4}}, "rank_pattern"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"peft_type": "IA3"}, "not a LoRA adapter"),
    ({"alora_invocation_tokens": [5, 6]}, "alora_invocation_tokens"),
    ({"use_qalora": True}, "use_qalora"),
    ({"r": 0}, "r must be a positive integer"),
])
def test_unsupported_options_are_refused_by_name(adapter, tmp_path, change, message):
    copy = _copy(adapter, tmp_path)
    edit_adapter_config(copy, **change)
    with pytest.raises(CheckpointError, match=message) as err:
        read_adapter("sql", copy, target_modules=ATTENTION, max_rank=16)
    assert "adapter_config.json" in err.value.where and err.value.fix


def test_a_rank_above_max_rank_says_what_to_raise(adapter):
    with pytest.raises(CheckpointError, match="rank 8 is above lora.max_rank 4") as err:
        read_adapter("sql", adapter, target_modules=ATTENTION, max_rank=4)
    assert "at least 8" in err.value.fix


def test_a_module_outside_the_recipes_target_modules_is_refused(adapter):
    with pytest.raises(CheckpointError, match="adapts k_proj, which is not in lora.target_modules") as err:
        read_adapter("sql", adapter, target_modules=("q_proj", "v_proj", "o_proj"), max_rank=16)
    assert "add 'k_proj'" in err.value.fix


def test_mlp_adapters_and_partial_layers_are_read(tiny_llama, tmp_path):
    path = make_peft_adapter(tiny_llama, tmp_path / "mlp", rank=4, target_modules=("up_proj", "down_proj"),
                             layers=[1])
    info = read_adapter("mlp", path, target_modules=ALL, max_rank=8)
    assert sorted(info.targets) == [(1, "down_proj"), (1, "up_proj")]


def test_not_an_adapter_directory(tmp_path, tiny_llama):
    with pytest.raises(CheckpointError, match="has no adapter_model.safetensors"):
        read_adapter("x", tiny_llama, target_modules=ATTENTION, max_rank=16)


def test_an_unknown_hub_adapter_offline_is_one_clear_error():
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache"):
        resolve_adapter("someone/no-such-adapter")
