"""The recipe -> vLLM Neuron plugin mapping (backends/vneuron/config.py): flags, neuron_config keys, refusals, the
key, and which framework a machine with the plugin picks."""

from __future__ import annotations

import json

import pytest

from neuronpack.backends.neuron.packages import clear_probe_cache
from neuronpack.backends.select import auto_framework
from neuronpack.backends.vneuron.config import plugin_config
from neuronpack.errors import RecipeError
from neuronpack.pipeline import compile_model
from neuronpack.recipe import load_recipe
from tests.backends.vneuron.plugin import RECIPES, STANDIN


def _config(*sets: str, recipe: str = "llama"):
    return plugin_config(load_recipe(RECIPES[recipe], overrides=list(sets)), {"torch_dtype": "bfloat16"})


def test_the_llama_recipe_maps_to_the_plugins_flags_and_neuron_config():
    config = _config()
    flags = config.vllm_flags()
    pairs = dict(zip(flags[0::2], flags[1::2], strict=True))
    assert pairs["--tensor-parallel-size"] == "8" and pairs["--max-num-seqs"] == "8"
    assert pairs["--max-model-len"] == "8192" and pairs["--max-num-batched-tokens"] == "2048"
    assert pairs["--block-size"] == "32" and pairs["--num-gpu-blocks-override"] == "2048"
    assert pairs["--dtype"] == "bfloat16" and pairs["--optimization-level"] == "2"
    assert json.loads(pairs["--additional-config"]) == {"neuron_config": {
        "num_batched_tokens_buckets": [256, 512, 1024, 2048], "num_seqs_buckets": [1, 2, 4, 8]}}
    assert config.env == {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", "NEURON_LOGICAL_NC_CONFIG": "2"}


def test_auto_buckets_and_block_count_follow_the_plugins_defaults():
    config = _config(recipe="qwen3")
    assert config.neuron_config["num_batched_tokens_buckets"] == [128, 256, 512, 1024]  # powers of 2 from 128
    assert config.neuron_config["num_seqs_buckets"] == [1, 2, 4]
    assert config.num_gpu_blocks == 4 * 4096 // 32  # every sequence at full length
    listed = _config("buckets.token_generation=[1024,4096]", "vneuron.num_seqs_buckets=[2]", recipe="qwen3")
    assert listed.neuron_config["decode_context_length_buckets"] == [1024, 4096]
    assert listed.neuron_config["num_seqs_buckets"] == [2, 4]  # the largest must equal max_num_seqs
    passed = _config('neuron_overrides.on_device_sampling_config={temperature = 0}')
    assert passed.neuron_config["on_device_sampling_config"] == {"temperature": 0}


@pytest.mark.parametrize(("sets", "message"), [
    (("lora.adapters=[{name='a', path='x'}]",), "[lora] cannot be built for the vLLM Neuron plugin"),
    (("quantization.dtype=int8",), "[quantization] cannot be built"),
    (("neuron_overrides.num_seqs_buckets=[1]",), "is made from the recipe's buckets"),
    (("neuron_overrides.fused_qkv=true",), "is not a neuron_config key the vLLM Neuron plugin reads"),
    (("target.instance=cpu",), "is not a target of the vLLM Neuron plugin"),
    (("vneuron.max_num_batched_tokens=1024",), "above max_num_batched_tokens 1024"),
    (("vneuron.num_seqs_buckets=[16]",), "must lie in 1..8"),
    (("target.nodes=2",), "builds one node"),
])
def test_what_the_plugin_cannot_honour_is_refused_by_name(sets, message):
    with pytest.raises(RecipeError, match=message.replace("[", r"\[").replace(".", r"\.")):
        _config(*sets)


def test_every_pinned_serve_argument_changes_the_key(tiny_llama, tmp_path):
    def key(*sets: str) -> str:
        return compile_model(str(tiny_llama), recipe=RECIPES["llama"], overrides=list(sets), dry_run=True,
                             out_root=tmp_path).key

    base = key()
    changed = {s: key(s) for s in ("vneuron.lnc=1", "vneuron.num_gpu_blocks=1024", "vneuron.block_size=64",
                                   "vneuron.optimization_level=3", "target.tp_degree=16", "target.batch_size=16",
                                   "target.seq_len=4096", "target.instance=trn3")}
    assert base not in changed.values() and len(set(changed.values())) == len(changed)
    assert key("name=renamed") == base  # a label is not an input


def test_a_machine_with_the_sdk_231_plugin_builds_vneuron_by_default(monkeypatch):
    monkeypatch.syspath_prepend(str(STANDIN))
    clear_probe_cache()
    try:
        choice = auto_framework()
        assert choice.name == "vneuron" and "0.21.0.1.0.0" in choice.reason
    finally:
        monkeypatch.undo()
        clear_probe_cache()


def test_doctor_names_the_sdk_231_pairing_and_the_path_this_machine_gets(tmp_path):
    from tests.backends.vneuron.plugin import neuronpack, plugin_env

    out = neuronpack("doctor", "--format", "json", env=plugin_env(tmp_path))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["serving"]["pairing"] == "sdk-2.31-vllm-neuron-0.21"
    assert "--framework vneuron" in report["serving"]["path"]
    assert report["framework"]["auto"] == "vneuron"
    rows = {p["name"]: p for p in report["serving"]["supported"]}
    assert rows["sdk-2.32-vllm-neuron-0.24"]["versions"]["vllm"] == "0.24."


def test_a_machine_with_vllm_neuron_029_is_refused_by_name_in_doctor_and_compile(tmp_path, tiny_llama):
    """vllm-neuron 0.29 (SDK 2.33): its default native route's cache entries are documented nowhere neuronpack could
    hold them to, so the stack is a refused row of the support matrix, named with the reason and what to do."""
    from tests.backends.vneuron.plugin import error_lines, neuronpack, with_plugin_version

    env = with_plugin_version(tmp_path, "0.29.0.1.0.0")
    report = json.loads(neuronpack("doctor", "--format", "json", env=env).stdout)
    assert report["serving"]["pairing"] == "sdk-2.33-vllm-neuron-0.29" and report["serving"]["refused"]
    assert "native route" in report["serving"]["path"] and "vllm-neuron 0.21 or 0.24" in report["serving"]["path"]
    shown = neuronpack("doctor", env={**env, "COLUMNS": "200"}).stdout
    assert "refused: sdk-2.33-vllm-neuron-0.29" in shown
    assert "not confirmed, so not relied on: NEURON_LIBTORCH_ASSERT_CACHE_HIT" in " ".join(shown.split())
    out = neuronpack("compile", str(tiny_llama), "--recipe", str(RECIPES["llama"]), "--out-root", str(tmp_path),
                     "--progress", "none", env=env)
    assert out.returncode == 1
    [line] = error_lines(out.stderr)
    assert "cannot build here: sdk-2.33-vllm-neuron-0.29: vllm-neuron 0.29 compiles through its native route" in line
