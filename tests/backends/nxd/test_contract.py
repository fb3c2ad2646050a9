"""Contract tests for the NxD Inference backend: every recipe's NeuronConfig, the compile call sequence against a
stand-in of the SDK (real module paths and class names), the artifact layout, version recording and checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from neuronpack.backends.base import BuildRequest
from neuronpack.backends.nxd.backend import NxdBackend
from neuronpack.backends.tnx.backend import TnxBackend
from neuronpack.errors import ArtifactError, BuildError, RecipeError, UnsupportedModelError
from neuronpack.recipe import load_recipe
from tests.backends.neuron_standin import fixtures as standin
from tests.helpers.manifests import make_manifest

pytestmark = pytest.mark.contract
nxd_sdk, sdk_path = standin.nxd_sdk, standin.sdk_path  # fixtures
RECIPES = sorted((Path(__file__).parents[3] / "recipes").glob("*.toml"))
SAMPLING_DEFAULT = {"do_sample": False, "top_k": 1, "top_p": 1.0, "temperature": 1.0, "dynamic": True,
                    "deterministic": False, "global_topk": 256}
BASE = {"ctx_batch_size": 1, "is_continuous_batching": True, "padding_side": "right",
        "sequence_parallel_enabled": True, "save_sharded_checkpoint": True, "quantized": False,
        "on_device_sampling_config": SAMPLING_DEFAULT, "enable_bucketing": True, "torch_dtype": "bfloat16"}
# The exact NeuronConfig kwargs for each shipped NxDI recipe, written out by hand from docs/neuron.md.
EXPECTED = {
    "llama-3.1-8b-instruct-trn1.toml": {
        **BASE, "tp_degree": 8, "batch_size": 4, "tkg_batch_size": 4, "max_context_length": 8192, "seq_len": 8192,
        "context_encoding_buckets": [128, 256, 512, 1024, 2048, 4096, 8192],
        "token_generation_buckets": [128, 256, 512, 1024, 2048, 4096, 8192]},
    "llama-3.1-70b-instruct-trn2.toml": {
        **BASE, "tp_degree": 64, "batch_size": 8, "tkg_batch_size": 8, "max_context_length": 4096, "seq_len": 8192,
        "context_encoding_buckets": [512, 1024, 2048, 4096],
        "token_generation_buckets": [128, 256, 512, 1024, 2048, 4096, 8192],
        "fused_qkv": True, "logical_nc_config": 2},
    "llama-3.2-1b-inf2.toml": {
        **BASE, "tp_degree": 2, "batch_size": 4, "tkg_batch_size": 4, "max_context_length": 2048, "seq_len": 4096,
        "context_encoding_buckets": [128, 256, 512, 1024, 2048],
        "token_generation_buckets": [128, 256, 512, 1024, 2048, 4096]},
    "llama-3.1-8b-instruct-int8-trn1.toml": {
        **BASE, "tp_degree": 8, "batch_size": 4, "tkg_batch_size": 4, "max_context_length": 4096, "seq_len": 4096,
        "context_encoding_buckets": [128, 256, 512, 1024, 2048, 4096],
        "token_generation_buckets": [128, 256, 512, 1024, 2048, 4096],
        "quantized": True, "quantization_type": "per_channel_symmetric", "quantization_dtype": "int8",
        "modules_to_not_convert": ["lm_head"], "kv_cache_quant": False},  # + quantized_checkpoints_path (model dir)
    "llama-3-8b-eagle-trn1.toml": {
        **BASE, "tp_degree": 8, "batch_size": 4, "tkg_batch_size": 4, "max_context_length": 4096, "seq_len": 4096,
        "context_encoding_buckets": [128, 256, 512, 1024, 2048, 4096],
        "token_generation_buckets": [128, 256, 512, 1024, 2048, 4096],
        "speculation_length": 4, "enable_fused_speculation": True, "enable_eagle_speculation": True},
}


def _request(recipe, model_dir: Path, staging: Path, draft_dir: Path | None = None) -> BuildRequest:
    return BuildRequest(model_dir=model_dir, recipe=recipe, plan=recipe.bucket_plan(), staging=staging,
                        draft_dir=draft_dir)


@pytest.fixture(scope="module")
def family_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A tiny checkpoint of each family a shipped recipe is for (tests/upstream/family_checkpoints.py)."""
    from tests.upstream.family_checkpoints import RECIPE_FAMILY, write_family_checkpoint

    root = tmp_path_factory.mktemp("families")
    return {name: write_family_checkpoint(root / name, name) for name in set(RECIPE_FAMILY.values())}


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_recipe_maps_to_exact_neuron_config(path, tiny_llama, family_checkpoints, tmp_path, nxd_sdk):
    """Each recipe on a tiny checkpoint of its own family: the exact NeuronConfig kwargs, NxDI's class for the family,
    and the kwargs taken by that class's NeuronConfig (the stand-in keeps what NxDI 0.9 would not know)."""
    from neuronpack.backends.neuron.common import import_class
    from neuronpack.backends.nxd.families import family_of
    from tests.upstream.family_checkpoints import recipe_family

    recipe = load_recipe(path)
    family = recipe_family(path)
    model = family_checkpoints[family] if family else tiny_llama
    request = _request(recipe, model, tmp_path / "staging")
    if recipe.instance_for("nxd") not in ("trn1", "trn2", "inf2"):
        with pytest.raises(RecipeError) as info:  # a CPU recipe cannot be forced onto Neuron silently
            NxdBackend().compile_config(request)
        assert info.value.where == "target.instance"
        return
    if recipe.target.framework == "tnx":
        config = TnxBackend().compile_config(request)
        assert config["from_pretrained"]["n_positions"] == list(recipe.bucket_plan().token_generation)
        assert config["from_pretrained"]["context_length_estimate"] == list(recipe.bucket_plan().context)
        return
    config = NxdBackend().compile_config(request)
    neuron_config = config["neuron_config"]
    hf_config = json.loads((model / "config.json").read_text())
    expected = dict(EXPECTED.get(path.name) or _reference(recipe, moe=family_of(hf_config).moe))
    if recipe.quantization is not None:
        expected["quantized_checkpoints_path"] = str(model)
    assert neuron_config == expected
    assert config["model_class"] == family_of(hf_config).model_class
    assert config["platform_target"] == recipe.target.instance
    neuron_config_cls = import_class(config["model_class"]).get_neuron_config_cls()
    assert neuron_config_cls(**neuron_config).unexpected == {}
    json.dumps(config)  # the whole compile config is JSON-able (it goes into the key and the manifest)


def _reference(recipe, *, moe: bool = False) -> dict:
    """Generic expectation for recipes added later (the hand-written table above covers the first ones); a MoE
    family's experts go over every tp rank (MoENeuronConfig moe_tp_degree = tp_degree, moe_ep_degree 1)."""
    plan = recipe.bucket_plan()
    out = {**BASE, "tp_degree": recipe.target.tp_degree, "batch_size": recipe.target.batch_size,
           "tkg_batch_size": recipe.target.batch_size, "max_context_length": plan.max_context_length,
           "seq_len": plan.seq_len, "enable_bucketing": recipe.buckets.enabled}
    if recipe.model.dtype != "auto":
        out["torch_dtype"] = recipe.model.dtype
    if recipe.buckets.enabled:
        out["context_encoding_buckets"] = list(plan.context)
        out["token_generation_buckets"] = list(plan.token_generation)
    if moe:
        out.update(moe_tp_degree=recipe.target.tp_degree, moe_ep_degree=1)
    return {**out, **recipe.neuron_overrides}


def _tiny_recipe(tmp_path: Path, extra: str = "", **target):
    fields = {"framework": '"nxd"', "instance": '"inf2"', "tp_degree": 2, "batch_size": 2, "seq_len": 256,
              "max_context_length": 128, **target}
    body = "\n".join(f"{k} = {v}" for k, v in fields.items())
    path = tmp_path / "nxd.toml"
    path.write_text(f'[model]\ndtype = "auto"\n[target]\n{body}\n{extra}')
    return load_recipe(path)


def test_build_calls_the_sdk_like_vllm_and_writes_the_layout(tiny_llama, tmp_path, nxd_sdk, monkeypatch):
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    recipe = _tiny_recipe(tmp_path)
    staging = tmp_path / "staging"
    staging.mkdir()
    extras = NxdBackend().build(_request(recipe, tiny_llama, staging))
    assert extras["nxd"]["platform_target"] == "inf2"
    events = [event for event, _ in nxd_sdk.CALLS]
    assert events == ["NeuronConfig", "load_pretrained_config", "model_init", "compile", "shard_weights"]
    compile_call = nxd_sdk.events("compile")[0]
    assert compile_call["platform_target"] == "inf2"
    assert compile_call["path"] == str(staging) + "/"
    assert nxd_sdk.events("model_init")[0]["model_path"] == str(tiny_llama) + "/"
    # layout: what NxDI compile writes plus the files vLLM reads from --model
    names = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    assert {"neuron_config.json", "model.pt", "weights/tp0_sharded_checkpoint.safetensors",
            "weights/tp1_sharded_checkpoint.safetensors", "config.json", "tokenizer.json",
            "tokenizer_config.json", "generation_config.json"} <= set(names)
    saved = json.loads((staging / "neuron_config.json").read_text())
    assert saved["neuron_config"]["context_encoding_buckets"] == [128]
    assert saved["neuron_config"]["token_generation_buckets"] == [128, 256]
    assert saved["neuron_config"]["torch_dtype"] == "float32"  # "auto" took the checkpoint's dtype
    assert saved["neuron_config"]["on_device_sampling_config"]["global_topk"] == 256
    assert saved["architectures"] == ["LlamaForCausalLM"]  # HF config merged by load_pretrained_config


def test_validate_artifact_checks_files_and_versions(tiny_llama, tmp_path, nxd_sdk):
    recipe = _tiny_recipe(tmp_path)
    staging = tmp_path / "art"
    staging.mkdir()
    backend = NxdBackend()
    config = backend.compile_config(_request(recipe, tiny_llama, staging))
    backend.build(_request(recipe, tiny_llama, staging))
    manifest = make_manifest(versions=backend.versions(), compile_config=config, model={"path": str(tiny_llama)})
    backend.validate_artifact(staging, manifest)
    old = manifest.model_copy(update={"versions": {**manifest.versions, "neuronx-cc": "2.18.0.0"}})
    with pytest.raises(ArtifactError) as info:
        backend.validate_artifact(staging, old)
    assert "built with neuronx-cc 2.18.0.0, this machine has 2.24.5133.0" in info.value.what
    (staging / "weights" / "tp1_sharded_checkpoint.safetensors").unlink()
    with pytest.raises(ArtifactError) as info:
        backend.validate_artifact(staging, manifest)
    assert info.value.where.endswith("weights/tp1_sharded_checkpoint.safetensors")
    (staging / "model.pt").unlink()
    with pytest.raises(ArtifactError, match="missing model.pt"):
        backend.validate_artifact(staging, manifest)


def test_multi_node_shards_every_rank_once(tiny_llama, tmp_path, nxd_sdk):
    recipe = _tiny_recipe(tmp_path, tp_degree=4, nodes=2)
    staging = tmp_path / "art"
    staging.mkdir()
    config = NxdBackend().compile_config(_request(recipe, tiny_llama, staging))
    assert (config["neuron_config"]["start_rank_id"], config["neuron_config"]["local_ranks_size"]) == (0, 4)
    assert config["multi_node"] == {"nodes": 2, "local_ranks_size": 2}
    NxdBackend().build(_request(recipe, tiny_llama, staging))
    assert sorted(p.name for p in (staging / "weights").iterdir()) == [
        f"tp{r}_sharded_checkpoint.safetensors" for r in range(4)]


def test_lora_and_overrides_map_to_neuron_config(tiny_llama, tmp_path, nxd_sdk, monkeypatch):
    extra = ('[lora]\nmax_rank = 32\nmax_loras = 2\nadapters = [{name = "sql", path = "/a/sql"}]\n'
             '[neuron_overrides]\nfused_qkv = true\nsequence_parallel_enabled = false\n')
    recipe = _tiny_recipe(tmp_path, extra)
    config = NxdBackend().compile_config(_request(recipe, tiny_llama, tmp_path))["neuron_config"]
    assert config["lora_config"] == {"max_loras": 2, "max_lora_rank": 32,
                                     "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
                                     "lora_ckpt_paths": {"sql": "lora/sql"}}  # copied into the artifact
    assert config["fused_qkv"] is True and config["sequence_parallel_enabled"] is False
    from neuronx_distributed_inference.models.config import NeuronConfig
    from neuronx_distributed_inference.modules.lora_serving import LoraServingConfig

    (tmp_path / "lora" / "sql").mkdir(parents=True)  # the adapter, where a built artifact carries it
    monkeypatch.chdir(tmp_path)  # NxDI resolves the relative path from the working directory (the artifact)
    built = NeuronConfig(**config)
    assert isinstance(built.lora_config, LoraServingConfig) and built.unexpected == {}


def test_eagle_draft_hints_and_fused_spec_build(tiny_llama, tmp_path, nxd_sdk):
    draft = tmp_path / "draft"
    shutil.copytree(tiny_llama, draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["neuronpack_eagle"] = {"nxd_hints": {"enable_eagle_speculation": True, "enable_fused_speculation": True,
                                             "enable_eagle_draft_input_norm": True, "is_eagle3": False,
                                             "fc_bias": True}}
    (draft / "config.json").write_text(json.dumps(cfg))
    recipe = _tiny_recipe(tmp_path, '[speculation]\nkind = "eagle"\ndraft = "d"\nlength = 3\n')
    staging = tmp_path / "art"
    staging.mkdir()
    request = _request(recipe, tiny_llama, staging, draft)
    config = NxdBackend().compile_config(request)
    n = config["neuron_config"]
    assert (n["speculation_length"], n["enable_fused_speculation"], n["enable_eagle_speculation"],
            n["enable_eagle_draft_input_norm"], n["is_eagle3"]) == (3, True, True, True, False)
    assert "fc_bias" not in n  # a draft config.json key, not a NeuronConfig field
    d = config["draft"]["neuron_config"]
    assert (d["is_eagle_draft"], d["enable_fused_speculation"], d["sequence_parallel_enabled"],
            d["speculation_length"]) == (True, False, False, 3)
    NxdBackend().build(request)
    fused = nxd_sdk.events("FusedSpecNeuronConfig")[0]
    assert fused == {"worker_cls": "NeuronLlamaModel", "draft_model_path": str(draft)}
    assert nxd_sdk.events("compile")[0]["fused_spec"] is True
    assert (staging / "draft" / "config.json").is_file()


def test_quantized_checkpoint_fields_come_from_the_quantizer(tiny_llama, tmp_path, nxd_sdk):
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint

    quantized = quantize_checkpoint(tiny_llama, tmp_path / "q", QuantizeOptions("fp8", "per-tensor")).out
    recipe = _tiny_recipe(tmp_path, '[quantization]\ndtype = "fp8"\ngranularity = "per-tensor"\nkv_cache = true\n')
    n = NxdBackend().compile_config(_request(recipe, quantized, tmp_path))["neuron_config"]
    assert (n["quantized"], n["quantized_checkpoints_path"], n["quantization_type"], n["quantization_dtype"],
            n["kv_cache_quant"]) == (True, str(quantized), "per_tensor_symmetric", "f8e4m3", True)
    assert "lm_head" in n["modules_to_not_convert"]


def test_a_quantized_checkpoint_compiled_without_a_quantization_section_loads_quantized(tiny_llama, tmp_path,
                                                                                        nxd_sdk):
    """A `neuronpack quantize`d checkpoint under a recipe without [quantization]: the NeuronConfig comes from the
    checkpoint's own record (compiled as float, NxDI would read the int8 values as floats and drop the scales)."""
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint

    quantized = quantize_checkpoint(tiny_llama, tmp_path / "q", QuantizeOptions("int8")).out
    n = NxdBackend().compile_config(_request(_tiny_recipe(tmp_path), quantized, tmp_path))["neuron_config"]
    assert (n["quantized"], n["quantized_checkpoints_path"], n["quantization_type"], n["quantization_dtype"],
            n["kv_cache_quant"]) == (True, str(quantized), "per_channel_symmetric", "int8", False)
    assert n["modules_to_not_convert"] == ["lm_head"]
    float_config = NxdBackend().compile_config(_request(_tiny_recipe(tmp_path), tiny_llama, tmp_path))
    assert float_config["neuron_config"]["quantized"] is False


def test_quantized_experts_are_refused(tmp_path, nxd_sdk):
    """A Qwen3-MoE checkpoint quantized with --include-experts (the portable backend's int8 experts): NxDI's converters
    would fuse the int8 values as floats and drop the scales, so the nxd backend refuses it with the fix."""
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint
    from tests.helpers.tiny_moe import make_tiny_moe_checkpoint

    source = make_tiny_moe_checkpoint(tmp_path / "moe", "qwen3_moe")
    quantized = quantize_checkpoint(source, tmp_path / "q", QuantizeOptions("int8", include_experts=True)).out
    with pytest.raises(RecipeError, match="cannot load quantized MoE experts") as err:
        NxdBackend().compile_config(_request(_tiny_recipe(tmp_path), quantized, tmp_path))
    assert "without --include-experts" in str(err.value)


def test_qwen2_and_unknown_architectures(make_checkpoint, tmp_path, nxd_sdk):
    """Qwen2 maps to NxDI's class. Saved by transformers 5 (rope_theta 1e6 inside rope_parameters, which NxDI's
    transformers 4.57 ignores for its default 1e4), its rope reaches NxDI in the released names: recorded in the
    compile config and set on the InferenceConfig; a config.json in the released names needs nothing. An unknown
    architecture is refused."""
    from tests.upstream.family_checkpoints import released_config

    recipe = _tiny_recipe(tmp_path)
    qwen = make_checkpoint("qwen2")
    staging = tmp_path / "staging"
    staging.mkdir()
    config = NxdBackend().compile_config(_request(recipe, qwen, staging))
    assert config["model_class"].endswith("qwen2.modeling_qwen2.NeuronQwen2ForCausalLM")
    assert config["config_overrides"] == {"rope_theta": 1000000.0, "rope_scaling": None}
    NxdBackend().build(_request(recipe, qwen, staging))
    assert json.loads((staging / "neuron_config.json").read_text())["rope_theta"] == 1000000.0
    released_config(qwen)
    assert "config_overrides" not in NxdBackend().compile_config(_request(recipe, qwen, tmp_path))
    odd = tmp_path / "odd"
    shutil.copytree(qwen, odd)
    cfg = json.loads((odd / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (odd / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        NxdBackend().compile_config(_request(recipe, odd, tmp_path))


def test_build_without_sdk_refuses_but_dry_run_config_works(tiny_llama, tmp_path, sdk_path):
    recipe = _tiny_recipe(tmp_path)
    request = _request(recipe, tiny_llama, tmp_path)
    assert NxdBackend().compile_config(request)["neuron_config"]["tp_degree"] == 2
    with pytest.raises(BuildError, match="neuronx-distributed-inference is not installed"):
        NxdBackend().build(request)


def test_prompt_lookup_is_refused_with_a_fix(tiny_llama, tmp_path, nxd_sdk):
    """NxDI's fused speculation needs a draft model: prompt lookup is refused before anything is compiled."""
    recipe = _tiny_recipe(tmp_path, '[speculation]\nkind = "prompt_lookup"\nlength = 3\n')
    with pytest.raises(RecipeError) as info:
        NxdBackend().compile_config(_request(recipe, tiny_llama, tmp_path / "staging"))
    assert "prompt_lookup" in info.value.what and "--framework torch" in info.value.fix
    assert not (tmp_path / "staging").exists()
