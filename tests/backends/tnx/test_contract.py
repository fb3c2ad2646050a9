"""Contract tests for the transformers-neuronx backend against a stand-in of the SDK (real module paths/classes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neuronpack.backends.base import BuildRequest
from neuronpack.backends.tnx.backend import TnxBackend
from neuronpack.errors import ArtifactError, UnsupportedModelError
from neuronpack.recipe import load_recipe
from tests.backends.neuron_standin import fixtures as standin
from tests.helpers.manifests import make_manifest

pytestmark = pytest.mark.contract
sdk_path, tnx_sdk = standin.sdk_path, standin.tnx_sdk  # fixtures
TNX_RECIPE = Path(__file__).parents[3] / "recipes" / "llama-3.2-1b-inf2-tnx.toml"


def _request(recipe, model_dir, staging):
    return BuildRequest(model_dir=model_dir, recipe=recipe, plan=recipe.bucket_plan(), staging=staging)


def test_shipped_tnx_recipe_maps_exactly(tiny_llama, tmp_path):
    config = TnxBackend().compile_config(_request(load_recipe(TNX_RECIPE), tiny_llama, tmp_path))
    assert config["model_class"] == "transformers_neuronx.llama.model.LlamaForSampling"
    assert config["from_pretrained"] == {"tp_degree": 2, "amp": "bf16", "batch_size": 2, "n_positions": [512, 2048],
                                         "context_length_estimate": [256, 512, 1024, 2048]}
    assert config["neuron_config"] == {
        "collectives_layout": "BSH", "attention_layout": "BSH", "fuse_qkv": True, "padding_side": "right",
        "continuous_batching": {"max_num_seqs": 2, "max_model_len": 2048},
        "on_device_generation": {"max_length": 2048, "do_sample": False, "top_k": 1, "top_p": 1.0,
                                 "temperature": 1.0, "global_top_k": 256, "dynamic": True,
                                 "deterministic": False, "per_batch_line": True}}


def test_build_compiles_saves_and_validates(tiny_llama, tmp_path, tnx_sdk):
    recipe = load_recipe(TNX_RECIPE, overrides=['quantization.dtype="fp8"'])
    staging = tmp_path / "art"
    staging.mkdir()
    backend = TnxBackend()
    extras = backend.build(_request(recipe, tiny_llama, staging))
    assert extras["tnx"]["compiled_with"] == "cpu_compile"  # no /dev/neuron* on a build box
    call = tnx_sdk.events("from_pretrained")[0]
    assert call["cls"] == "LlamaForSampling" and call["path"] == str(tiny_llama)
    assert call["kwargs"] == {"tp_degree": 2, "amp": "bf16", "batch_size": 2, "n_positions": [512, 2048],
                              "context_length_estimate": [256, 512, 1024, 2048]}
    assert call["neuron_config"]["quant"] == {"quant_dtype": "f8e4m3fn", "dequant_dtype": "bf16",
                                              "quantize_method": "vector_dynamic"}
    assert call["neuron_config"]["continuous_batching"]["max_num_seqs"] == 2
    assert tnx_sdk.events("cpu_compile")[0]["platform_target"] == "inf2"
    assert len(list((staging / "neffs").glob("*.neff"))) == 6  # 4 context + 2 token-generation kernels
    assert json.loads((staging / "tnx_config.json").read_text())["platform_target"] == "inf2"
    assert (staging / "config.json").is_file() and (staging / "tokenizer.json").is_file()
    manifest = make_manifest(versions=backend.versions())
    assert manifest.versions["transformers-neuronx"] == "0.13.1216"
    backend.validate_artifact(staging, manifest)
    with pytest.raises(ArtifactError, match="transformers-neuronx 0.12.0"):
        backend.validate_artifact(staging, make_manifest(versions={**manifest.versions,
                                                                   "transformers-neuronx": "0.12.0"}))
    for neff in (staging / "neffs").iterdir():
        neff.unlink()
    with pytest.raises(ArtifactError, match="no compiled NEFFs"):
        backend.validate_artifact(staging, manifest)


def test_tnx_refuses_what_it_cannot_build(tiny_llama, tmp_path):
    spec = load_recipe(TNX_RECIPE, overrides=['speculation.draft="d"'])
    with pytest.raises(UnsupportedModelError, match="no speculation or LoRA"):
        TnxBackend().compile_config(_request(spec, tiny_llama, tmp_path))
    with pytest.raises(Exception, match="not a Neuron instance"):
        TnxBackend().target(load_recipe(TNX_RECIPE, overrides=['target.instance="cpu"']))


def test_tnx_availability_needs_the_package(sdk_path):
    availability = TnxBackend().availability()
    assert (availability.ok, availability.reason) == (False, "transformers-neuronx is not installed")
