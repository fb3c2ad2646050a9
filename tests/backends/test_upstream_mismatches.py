"""One contract test per mismatch found by running upstream's own code on neuronpack's output (issue 11; the list
is in docs/neuron.md "Checked against upstream source"). Each fails on the old behaviour; the stand-in SDK
reproduces the upstream behaviour it depends on."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from neuronpack.backends.base import BuildRequest
from neuronpack.backends.nxd.backend import NxdBackend
from neuronpack.backends.nxd.config import nxd_module_names
from neuronpack.errors import ArtifactError, RecipeError, UnsupportedModelError
from neuronpack.pipeline import verify_artifact
from neuronpack.recipe import load_recipe
from tests.backends.neuron_standin import fixtures as standin

pytestmark = pytest.mark.contract
nxd_sdk, sdk_path = standin.nxd_sdk, standin.sdk_path  # fixtures
TINY = ["target.framework=nxd", "target.instance=inf2", "target.tp_degree=2", "target.batch_size=2",
        "target.seq_len=256", "target.max_context_length=128", "model.dtype=bfloat16"]


def _recipe(tmp_path: Path, extra: str = "") -> object:
    path = tmp_path / "r.toml"
    path.write_text('[model]\ndtype = "bfloat16"\n[target]\nframework = "nxd"\ninstance = "inf2"\ntp_degree = 2\n'
                    f'batch_size = 2\nseq_len = 256\nmax_context_length = 128\n{extra}')
    return load_recipe(path)


def _request(recipe, model_dir: Path, staging: Path, draft_dir: Path | None = None) -> BuildRequest:
    staging.mkdir(parents=True, exist_ok=True)
    return BuildRequest(model_dir=model_dir, recipe=recipe, plan=recipe.bucket_plan(), staging=staging,
                        draft_dir=draft_dir)


def _adapter(root: Path, name: str, model_dir: Path) -> Path:
    from tests.helpers.lora_adapters import make_peft_adapter

    return make_peft_adapter(model_dir, root / name, rank=8, target_modules=("q_proj",))


def test_lora_artifact_carries_its_adapters_and_reloads_after_they_are_gone(tiny_llama, tmp_path, nxd_sdk,
                                                                           monkeypatch):
    from neuronpack.pipeline import compile_model

    adapters = tmp_path / "adapters"
    sql = _adapter(adapters, "sql", tiny_llama)
    recipe = tmp_path / "lora.toml"
    recipe.write_text(f'[lora]\nmax_rank = 16\nadapters = [{{name = "sql", path = "{sql}"}}]\n')
    art = compile_model(str(tiny_llama), recipe=recipe, overrides=TINY, out_root=tmp_path / "root").path
    assert (art / "lora" / "sql" / "adapter_config.json").is_file()
    saved = json.loads((art / "neuron_config.json").read_text())["neuron_config"]["lora_config"]
    assert saved["lora_ckpt_paths"] == {"sql": "lora/sql"}
    shutil.rmtree(adapters)  # the build-time path is gone on the server
    from neuronx_distributed_inference.models.llama.modeling_llama import NeuronLlamaForCausalLM

    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError):  # what vLLM would hit from elsewhere (and then recompile in place)
        NeuronLlamaForCausalLM(str(art))
    monkeypatch.chdir(art)  # serve starts vLLM with the artifact as working directory
    NeuronLlamaForCausalLM(str(art))
    verify_artifact(art)


def test_verify_refuses_a_lora_adapter_outside_the_artifact(tmp_path):
    from neuronpack.backends.nxd.backend import check_lora_adapters

    config = {"lora_config": {"lora_ckpt_paths": {"sql": "/build/box/sql"}}}
    with pytest.raises(ArtifactError, match="not inside the artifact"):
        check_lora_adapters(tmp_path, config)


def test_lora_ranks_are_limited_to_the_ones_vllm_serves(tmp_path):
    with pytest.raises(RecipeError, match="not one vLLM serves"):
        _recipe(tmp_path, '[lora]\nmax_rank = 48\nadapters = [{name = "a", path = "/a"}]\n')
    assert _recipe(tmp_path, '[lora]\nmax_rank = 320\nadapters = [{name = "a", path = "/a"}]\n').lora.max_rank == 320


def test_skip_lists_use_nxdi_module_names():
    # NxDI matches modules_to_not_convert by substring against its own names: layers.N.self_attn.qkv_proj.q_proj
    assert nxd_module_names(["lm_head", "model.layers.1.self_attn.q_proj", "layers.2.mlp.down_proj"],
                            fused_qkv=False) == ["lm_head", "model.layers.1.self_attn.qkv_proj.q_proj",
                                                 "layers.2.mlp.down_proj"]
    # fused_qkv: q, k and v are one Wqkv weight, so a partial skip is widened to the attention block
    assert nxd_module_names(["layers.1.self_attn.k_proj", "layers.1.self_attn.v_proj"], fused_qkv=True) == [
        "layers.1.self_attn"]


def test_quantized_recipe_skip_reaches_nxdi_in_its_names(tiny_llama, tmp_path, nxd_sdk):
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint

    options = QuantizeOptions("int8", "per-channel", skip=("model.layers.1.self_attn.q_proj",))
    quantized = quantize_checkpoint(tiny_llama, tmp_path / "q", options).out
    recipe = _recipe(tmp_path, '[quantization]\ndtype = "int8"\nskip = ["model.layers.1.self_attn.q_proj"]\n')
    n = NxdBackend().compile_config(_request(recipe, quantized, tmp_path / "s"))["neuron_config"]
    assert any(m.endswith("layers.1.self_attn.qkv_proj.q_proj") for m in n["modules_to_not_convert"])
    assert not any(m.endswith("self_attn.q_proj") for m in n["modules_to_not_convert"])


def test_draft_neuron_config_keeps_fused_speculation_off(tiny_llama, tmp_path, nxd_sdk):
    draft = tmp_path / "draft"
    shutil.copytree(tiny_llama, draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["neuronpack_eagle"] = {"nxd_hints": {"enable_eagle_speculation": True, "enable_fused_speculation": True,
                                             "enable_eagle_draft_input_norm": False, "is_eagle3": False}}
    (draft / "config.json").write_text(json.dumps(cfg))
    recipe = _recipe(tmp_path, '[speculation]\nkind = "eagle"\ndraft = "d"\nlength = 3\n')
    request = _request(recipe, tiny_llama, tmp_path / "art", draft)
    NxdBackend().build(request)
    saved = json.loads((tmp_path / "art" / "neuron_config.json").read_text())
    drafted = saved["fused_spec_config"]["draft_config"]["neuron_config"]
    # NeuronConfig(**dict) would have turned it back on (enable_eagle_speculation forces it in __init__)
    assert drafted["enable_fused_speculation"] is False and drafted["is_eagle_draft"] is True
    assert drafted["enable_eagle_speculation"] is True and saved["neuron_config"]["enable_fused_speculation"] is True


def test_eagle3_is_refused_on_nxdi_older_than_0_7(tiny_llama, tmp_path, sdk_path):
    old = tmp_path / "old-nxdi"
    info = old / "neuronx_distributed_inference-0.6.10598.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: neuronx-distributed-inference\nVersion: 0.6.10598\n")
    sdk_path("nxd", "compiler")
    sdk_path(old)  # prepended last: its metadata (0.6) is the one found
    from neuronx_distributed_inference.models.config import NeuronConfig

    assert "is_eagle3" in NeuronConfig(is_eagle3=True).unexpected  # what NxDI 0.6 does with it: drops it
    draft = tmp_path / "draft"
    shutil.copytree(tiny_llama, draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["neuronpack_eagle"] = {"nxd_hints": {"enable_eagle_speculation": True, "is_eagle3": True}}
    (draft / "config.json").write_text(json.dumps(cfg))
    recipe = _recipe(tmp_path, '[speculation]\nkind = "eagle"\ndraft = "d"\nlength = 3\n')
    with pytest.raises(UnsupportedModelError, match="EAGLE-3 drafts need neuronx-distributed-inference >= 0.7"):
        NxdBackend().compile_config(_request(recipe, tiny_llama, tmp_path / "s", draft))


def test_published_neuron_artifacts_are_read_only_and_still_collectable(tiny_llama, tmp_path, nxd_sdk):
    from neuronpack.artifacts.listing import plan_gc, run_gc
    from neuronpack.pipeline import compile_model

    art = compile_model(str(tiny_llama), overrides=TINY, out_root=tmp_path / "root").path
    for path in [art, *art.rglob("*")]:
        assert not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), path
    if os.geteuid() != 0:  # root ignores permission bits (docs/artifacts.md says so)
        with pytest.raises(PermissionError):
            (art / "model.pt").write_bytes(b"recompiled")
    run_gc(plan_gc(art.parent, keep=0))
    assert not art.exists()


def test_mllama_maps_to_nxdi_classes_with_its_vision_plan(make_checkpoint, tmp_path, nxd_sdk):
    llama = make_checkpoint("llama")
    mllama = tmp_path / "mllama"
    shutil.copytree(llama, mllama)
    cfg = json.loads((mllama / "config.json").read_text())
    cfg.update({"architectures": ["MllamaForConditionalGeneration"], "model_type": "mllama",
                "vision_config": {"max_num_tiles": 4, "image_size": 560, "patch_size": 14}})
    (mllama / "config.json").write_text(json.dumps(cfg))
    config = NxdBackend().compile_config(_request(_recipe(tmp_path), mllama, tmp_path / "s"))
    assert config["model_class"].endswith("mllama.modeling_mllama.NeuronMllamaForCausalLM")
    assert config["vision"]["max_num_tiles"] == 4 and config["neuron_config"]["skip_vision"] is False
    from neuronx_distributed_inference.models.mllama.modeling_mllama import NeuronMllamaForCausalLM

    built = NeuronMllamaForCausalLM.get_neuron_config_cls()(**config["neuron_config"])
    assert built.unexpected == {} and built.skip_vision is False


def test_serve_verifies_before_launching_and_refuses_a_modified_artifact(tiny_llama, tmp_path, nxd_sdk):
    from typer.testing import CliRunner

    from neuronpack.cli.app import app
    from neuronpack.pipeline import compile_model

    art = compile_model(str(tiny_llama), overrides=TINY, out_root=tmp_path / "root").path
    target = art / "model.pt"
    os.chmod(art, 0o755)
    os.chmod(target, 0o644)
    target.write_bytes(b"what a fallback compile would leave behind")
    result = CliRunner().invoke(app, ["serve", str(art), "--print-command"])
    assert result.exit_code == 1 and "model.pt" in result.stderr and "cd " not in result.stdout
