"""ArtifactConfig: neuron_config.json of a portable artifact, read and written by one module (torch-free).

The fixtures are files as neuronpack wrote them before the config was typed (copied from real builds): they must
read, and write back byte for byte."""

import json

import pytest

from neuronpack.backends.torch_aot.artifact_config import (
    ArtifactConfig,
    LoraConfig,
    SpeculationSection,
    read_artifact_config,
    write_artifact_config,
)
from neuronpack.backends.torch_aot.layout import FORMAT_VERSION
from neuronpack.errors import ArtifactError

TARGET = {"compiler": "aoti", "cpu_capability": "AVX512", "device": "cpu", "machine": "x86_64",
          "cxx": {"path": "/usr/bin/g++", "version": "g++ (Debian 12.2.0-14+deb12u1) 12.2.0"},
          "inductor": {"aot_inductor.package": True, "aot_inductor.package_constants_in_so": False},
          "torch": "2.13.0+cpu"}
# A tiny-test.toml AOTInductor build (neuronpack before ArtifactConfig).
OLD_AOTI = {
    "batch_size": 2, "compiler": "aoti", "context_encoding_buckets": [16, 64], "ctx_batch_size": 1,
    "enable_bucketing": True, "format": "neuronpack-torch", "format_version": FORMAT_VERSION,
    "graphs": {"head": "head", "layer_decode": "layer_decode", "layer_step": "layer_step"}, "head_dim": 16,
    "is_continuous_batching": True, "kv_cache_dtype": "float32", "kv_cache_positions": 129, "layer_graphs": [0, 0],
    "linear_kernels": True, "lora": None, "max_context_length": 64, "max_length": 128, "max_step_tokens": 64,
    "model_type": "llama", "num_kv_heads": 2, "num_layers": 2, "padding_side": "right", "quantization_dtype": None,
    "quantized": False, "seq_len": 128, "speculation": None, "target": TARGET, "tkg_batch_size": 2,
    "token_generation_buckets": [64, 128], "torch_dtype": "float32", "tp_degree": 1, "vocab_size": 384,
}
EAGLE1 = {"kind": "eagle", "length": 4, "draft": "draft", "draft_dtype": "float32", "layout": "eagle1",
          "target_layers": None}
LORA = {"max_loras": 2, "max_rank": 8, "target_modules": ["q_proj", "v_proj"],
        "adapters": [{"name": "sql", "path": "lora/sql", "rank": 8}, {"name": "chat", "path": "lora/chat", "rank": 4}]}


def _old_file(tmp_path, data) -> bytes:
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"  # how build.py wrote it
    (tmp_path / "neuron_config.json").write_text(text)
    return text.encode()


@pytest.mark.parametrize("extra", [
    {},
    {"speculation": EAGLE1, "graphs": {**OLD_AOTI["graphs"], "draft_step": "draft_step", "draft_head": "draft_head"}},
    {"speculation": {**EAGLE1, "layout": "eagle3", "target_layers": [0, 1, 1]}},
    {"speculation": {"kind": "prompt_lookup", "length": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 5},
     "max_step_tokens": 64},
    {"lora": LORA},
    {"quantized": True, "quantization_dtype": "int8", "layer_graphs": [0, 1],
     "graphs": {"layer_decode": "layer_decode", "layer_step": "layer_step", "layer_decode.1": "layer_decode.1",
                "layer_step.1": "layer_step.1", "head": "head"}},
])
def test_an_old_file_reads_and_writes_back_byte_for_byte(tmp_path, extra):
    before = _old_file(tmp_path, {**OLD_AOTI, **extra})
    config = read_artifact_config(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    write_artifact_config(out, config)
    assert (out / "neuron_config.json").read_bytes() == before


def test_fields_are_typed_and_frozen(tmp_path):
    _old_file(tmp_path, {**OLD_AOTI, "speculation": EAGLE1, "lora": LORA})
    config = read_artifact_config(tmp_path)
    assert config.context_encoding_buckets == (16, 64) and config.layer_graphs == (0, 0)
    assert config.speculation == SpeculationSection("eagle", 4, draft="draft", draft_dtype="float32", layout="eagle1")
    assert isinstance(config.lora, LoraConfig) and config.adapter_names == ("sql", "chat")
    assert config.kernels and config.target["cpu_capability"] == "AVX512"
    with pytest.raises(AttributeError):
        config.batch_size = 4


def test_a_file_without_format_version_reads_as_the_current_format(tmp_path):
    _old_file(tmp_path, {k: v for k, v in OLD_AOTI.items() if k != "format_version"})
    config = read_artifact_config(tmp_path)
    assert config.format_version == FORMAT_VERSION
    assert config.to_dict()["format_version"] == FORMAT_VERSION


def test_another_format_version_is_refused_before_its_fields_are_read(tmp_path):
    _old_file(tmp_path, {"format": "neuronpack-torch", "format_version": 1, "buckets": [128]})
    with pytest.raises(ArtifactError, match="artifact format 1 is not the format"):
        read_artifact_config(tmp_path)


@pytest.mark.parametrize(("change", "message"), [
    ({"batch_size": "2"}, "batch_size must be an integer"),
    ({"enable_bucketing": 1}, "enable_bucketing must be true or false"),
    ({"context_encoding_buckets": [16, None]}, "context_encoding_buckets must be an integer"),
    ({"speculation": {"kind": "eagle"}}, "speculation.length must be an integer"),
    ({"lora": {**LORA, "adapters": [{"name": "sql", "path": "lora/sql"}]}}, r"lora.adapters\[0\].rank"),
    ({"graphs": {"head": 3}}, "graphs.head must be a string"),
    ({"num_layers": None}, "num_layers must be an integer"),
])
def test_a_bad_field_is_named(tmp_path, change, message):
    _old_file(tmp_path, {**OLD_AOTI, **change})
    with pytest.raises(ArtifactError, match=message) as info:
        read_artifact_config(tmp_path)
    assert "neuronpack compile --force" in info.value.fix


def test_a_missing_field_is_named(tmp_path):
    _old_file(tmp_path, {k: v for k, v in OLD_AOTI.items() if k != "vocab_size"})
    with pytest.raises(ArtifactError, match="neuron_config.json has no vocab_size"):
        read_artifact_config(tmp_path)


def test_compile_config_leaves_out_the_target_and_what_only_the_build_knows():
    built = ArtifactConfig.from_dict(OLD_AOTI)
    planned = ArtifactConfig.from_dict({k: v for k, v in OLD_AOTI.items()
                                        if k not in ("graphs", "layer_graphs", "linear_kernels")})
    assert set(built.to_dict()) - set(planned.to_dict()) == {"graphs", "layer_graphs", "linear_kernels"}
    assert "target" not in planned.compile_config() and "graphs" not in planned.compile_config()
    assert planned.built(linear_kernels=True, layer_graphs=[0, 0], graphs=OLD_AOTI["graphs"],
                         speculation=None) == built
    assert list(planned.to_dict())[:3] == ["format", "format_version", "compiler"]
