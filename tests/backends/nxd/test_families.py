"""The 2026 model families on the nxd backend, against the stand-in SDK: each family's NxDI class and config classes
in ``compile --dry-run``, the build's call sequence and layout (Llama 4: NxDI's image-to-text class, a text and a
vision NeuronConfig, text_model/ and vision_model/), the MoE fields, and every refusal by name (Gemma 3 with NxDI
0.9.0's two defects, DeepSeek-V3, a text-only Llama 4, a gpt-oss checkpoint NxDI's converter cannot read, a draft
NxDI cannot speculate with). NxDI's own classes judge these checkpoints in tests/upstream."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neuronpack.backends.base import BuildRequest
from neuronpack.backends.nxd.backend import NxdBackend
from neuronpack.errors import RecipeError, UnsupportedModelError
from neuronpack.recipe import load_recipe
from tests.backends.neuron_standin import fixtures as standin
from tests.upstream.family_checkpoints import write_family_checkpoint

pytestmark = pytest.mark.contract
nxd_sdk, sdk_path = standin.nxd_sdk, standin.sdk_path  # fixtures
NXDI = "neuronx_distributed_inference.models"
CLASSES = {"qwen3": f"{NXDI}.qwen3.modeling_qwen3.NeuronQwen3ForCausalLM",
           "qwen3_moe": f"{NXDI}.qwen3_moe.modeling_qwen3_moe.NeuronQwen3MoeForCausalLM",
           "gpt_oss": f"{NXDI}.gpt_oss.modeling_gpt_oss.NeuronGptOssForCausalLM",
           "llama4": f"{NXDI}.llama4.modeling_llama4.NeuronLlama4ForCausalLM"}


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: write_family_checkpoint(root / name, name) for name in CLASSES}


def _recipe(tmp_path: Path, extra: str = "", **target):
    fields = {"framework": '"nxd"', "instance": '"trn2"', "tp_degree": 4, "batch_size": 2, "seq_len": 256,
              "max_context_length": 128, **target}
    path = tmp_path / "nxd.toml"
    path.write_text('[model]\ndtype = "bfloat16"\n[target]\n' + "\n".join(f"{k} = {v}" for k, v in fields.items())
                    + f"\n{extra}")
    return load_recipe(path)


def _request(recipe, model_dir: Path, staging: Path, draft_dir: Path | None = None) -> BuildRequest:
    return BuildRequest(model_dir=model_dir, recipe=recipe, plan=recipe.bucket_plan(), staging=staging,
                        draft_dir=draft_dir)


def _edited(src: Path, out: Path, **config) -> Path:
    shutil.copytree(src, out)
    data = json.loads((out / "config.json").read_text())
    data.update(config)
    (out / "config.json").write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_dry_run_names_nxdis_class_for_each_family(families, family, tmp_path):
    """The bar of issue #54: `compile --dry-run` of a Qwen3, Qwen3-MoE, gpt-oss (and Llama 4) checkpoint names
    NxDI's class; MoE families get MoENeuronConfig's expert degrees (experts over every tp rank by default)."""
    _recipe(tmp_path)
    out = subprocess.run([sys.executable, "-m", "neuronpack", "compile", str(families[family]), "--recipe",
                          str(tmp_path / "nxd.toml"), "--dry-run", "--format", "json", "--out-root",
                          str(tmp_path / "root")],
                         capture_output=True, text=True, check=True)
    dry = json.loads(out.stdout)
    assert dry["framework"] == "nxd" and dry["model_class"] == CLASSES[family]
    neuron_config = dry["neuron_config"]
    moe = family != "qwen3"
    assert (neuron_config.get("moe_tp_degree"), neuron_config.get("moe_ep_degree")) == ((4, 1) if moe else
                                                                                        (None, None))
    assert ("vision_neuron_config" in dry) == (family == "llama4")


def test_each_family_builds_with_its_own_config_classes(families, tmp_path, nxd_sdk):
    """compile_config -> build: the stand-in's config classes (names and fields as NxDI 0.9's) take every kwarg."""
    for family in ("qwen3", "qwen3_moe", "gpt_oss"):
        nxd_sdk.CALLS.clear()
        staging = tmp_path / family
        staging.mkdir()
        extras = NxdBackend().build(_request(_recipe(tmp_path), families[family], staging))
        assert extras["nxd"]["model_class"] == CLASSES[family]
        (built,) = nxd_sdk.events("NeuronConfig")
        assert built["kwargs"]["unexpected"] == {}
        assert (staging / "model.pt").is_file()
        assert (staging / "weights" / "tp3_sharded_checkpoint.safetensors").is_file()


def test_llama4_builds_text_and_vision_with_nxdis_image_to_text_class(families, tmp_path, nxd_sdk):
    """Meta's Llama4ForConditionalGeneration layout: NxDI's image-to-text class, as vLLM's Neuron plugin loads it:
    Llama4InferenceConfig(text_neuron_config, vision_neuron_config) (the vision one without the text buckets);
    the artifact holds text_model/model.pt and vision_model/model.pt, and verify checks both."""
    staging = tmp_path / "art"
    staging.mkdir()
    backend = NxdBackend()
    request = _request(_recipe(tmp_path), families["llama4"], staging)
    config = backend.compile_config(request)
    assert "context_encoding_buckets" in config["neuron_config"]
    assert "context_encoding_buckets" not in config["vision_neuron_config"]
    backend.build(request)
    text, vision = nxd_sdk.events("NeuronConfig")
    assert text["kwargs"]["unexpected"] == vision["kwargs"]["unexpected"] == {}
    assert [e for e, _ in nxd_sdk.CALLS][-3:] == ["compile", "shard_text_weights", "shard_vision_weights"]
    assert (staging / "text_model" / "model.pt").is_file() and (staging / "vision_model" / "model.pt").is_file()
    assert backend.graph_files(["model.pt", "text_model/model.pt", "vision_model/model.pt", "config.json"]) == [
        "model.pt", "text_model/model.pt", "vision_model/model.pt"]


def test_gemma3_is_refused_naming_nxdis_two_defects(make_checkpoint, tmp_path, sdk_path):
    """No NxDI here to judge it: Gemma 3 is refused with both upstream defects, file and line."""
    gemma = _edited(make_checkpoint("llama"), tmp_path / "gemma3", architectures=["Gemma3ForCausalLM"])
    with pytest.raises(UnsupportedModelError) as info:
        NxdBackend().compile_config(_request(_recipe(tmp_path), gemma, tmp_path / "staging"))
    what = info.value.what
    assert "Gemma3ForCausalLM" in what and "models/model_base.py:794" in what
    assert "models/model_base.py:1394" in what and "attention_base.py:474" in what
    assert "CPU run" in info.value.fix


@pytest.mark.parametrize(("arch", "reason"), [
    ("DeepseekV3ForCausalLM", "no DeepSeek-V3 model class"),
    ("Llama4ForCausalLM", "text-only Llama 4"),
    ("Gemma3ForConditionalGeneration", "Gemma 3 text class only"),
])
def test_architectures_nxdi_cannot_build_are_refused_by_name(make_checkpoint, tmp_path, arch, reason, nxd_sdk):
    model = _edited(make_checkpoint("llama"), tmp_path / arch, architectures=[arch])
    with pytest.raises(UnsupportedModelError) as info:
        NxdBackend().compile_config(_request(_recipe(tmp_path), model, tmp_path / "staging"))
    assert arch in info.value.what and reason in info.value.what


def test_a_gpt_oss_checkpoint_nxdi_cannot_convert_is_refused(families, tmp_path, nxd_sdk):
    """NxDI's converter reads only the released MXFP4 experts, and its config class needs initial_context_length:
    a bf16-dequantized copy (what transformers' save_pretrained writes) and a config without the key are refused
    before any compile, by name."""
    import transformers

    from tests.upstream.family_checkpoints import _config, _model_class, _randomised

    dequantized = tmp_path / "gpt-oss-bf16"
    config = _config(transformers, "gpt_oss", 384)
    _randomised(_model_class(transformers, "gpt_oss")(config), 0).save_pretrained(dequantized)
    recipe = _recipe(tmp_path)
    with pytest.raises(UnsupportedModelError) as info:
        NxdBackend().compile_config(_request(recipe, dequantized, tmp_path / "s1"))
    assert "bf16-dequantized experts" in info.value.what and "modeling_gpt_oss.py:206" in info.value.what
    no_key = _edited(families["gpt_oss"], tmp_path / "no-key")
    data = json.loads((no_key / "config.json").read_text())
    del data["initial_context_length"]  # what a re-save through transformers' GptOssConfig does
    (no_key / "config.json").write_text(json.dumps(data))
    with pytest.raises(UnsupportedModelError, match="initial_context_length"):
        NxdBackend().compile_config(_request(recipe, no_key, tmp_path / "s2"))


@pytest.mark.parametrize(("family", "kind", "reason"), [
    ("qwen3", "eagle", "NeuronQwen3Model makes no EAGLE `fc` layer"),
    ("qwen3_moe", "eagle", "NeuronQwen3MoeModel makes no EAGLE `fc` layer"),
    ("gpt_oss", "eagle", "NeuronGptOssModel"),
    ("llama4", "draft", "Llama4 does not yet support fused speculation"),
])
def test_a_draft_nxdi_cannot_speculate_with_is_refused(families, tmp_path, family, kind, reason, nxd_sdk):
    recipe = _recipe(tmp_path, f'[speculation]\nkind = "{kind}"\ndraft = "d"\nlength = 3\n')
    with pytest.raises(RecipeError) as info:
        NxdBackend().compile_config(_request(recipe, families[family], tmp_path / "staging"))
    assert reason in info.value.what and info.value.where == "recipe [speculation]"


def test_expert_parallel_degrees_are_checked(families, tmp_path, nxd_sdk):
    ok = _recipe(tmp_path, "[neuron_overrides]\nmoe_tp_degree = 2\nmoe_ep_degree = 2\n")
    config = NxdBackend().compile_config(_request(ok, families["qwen3_moe"], tmp_path))["neuron_config"]
    assert (config["moe_tp_degree"], config["moe_ep_degree"]) == (2, 2)
    from neuronx_distributed_inference.models.qwen3_moe.modeling_qwen3_moe import NeuronQwen3MoeForCausalLM

    assert NeuronQwen3MoeForCausalLM.get_neuron_config_cls()(**config).unexpected == {}
    bad = _recipe(tmp_path, "[neuron_overrides]\nmoe_ep_degree = 2\n")
    with pytest.raises(RecipeError, match="moe_tp_degree 4 x moe_ep_degree 2 is not the tp_degree 4"):
        NxdBackend().compile_config(_request(bad, families["qwen3_moe"], tmp_path))
    odd = _recipe(tmp_path, "[neuron_overrides]\nmoe_tp_degree = 1\nmoe_ep_degree = 8\n", tp_degree=8)
    with pytest.raises(RecipeError, match="4 experts do not divide over moe_ep_degree 8"):
        NxdBackend().compile_config(_request(odd, families["qwen3_moe"], tmp_path))


def test_convert_eagle_refuses_a_target_nxdi_cannot_speculate_with(families, tmp_path):
    """convert-eagle writes the Llama-layout EAGLE head NxDI's Llama class reads; for a Qwen3 (or any other family's)
    target it refuses by name before writing anything. Its target list is the family table's."""
    from neuronpack.backends.nxd.families import FAMILIES
    from neuronpack.convert.eagle import convert_eagle
    from neuronpack.convert.eagle_layouts import EAGLE_TARGETS
    from neuronpack.errors import ConversionError
    from tests.convert.eagle_fixtures import make_eagle1_draft

    assert set(EAGLE_TARGETS) == {arch for arch, family in FAMILIES.items() if family.no_eagle is None}
    draft = make_eagle1_draft(tmp_path / "draft", hidden=64, vocab=384, layout="safetensors")
    for family in ("qwen3", "gpt_oss", "llama4"):
        with pytest.raises(ConversionError) as info:
            convert_eagle(draft, families[family], tmp_path / f"out-{family}")
        assert "only its Llama class" in info.value.what and not (tmp_path / f"out-{family}").exists()


@pytest.mark.parametrize("family", ["qwen3_moe", "llama4"])
def test_a_fine_tune_reuses_the_familys_traced_graphs(families, tmp_path, nxd_sdk, family):
    """A fine-tune (same names / shapes / dtypes, new values) has the donor's graph key: NxDI's traced model (Llama 4:
    text_model/ and vision_model/) is linked in and only the weights are sharded again, through NxDI's own sharding
    (the image-to-text class: its text and vision sharding)."""
    from neuronpack.pipeline import compile_model
    from tests.helpers.tiny_models import fine_tune_copy

    sets = ["target.framework=nxd", "target.instance=trn2", "target.tp_degree=2", "target.batch_size=2",
            "target.seq_len=256", "target.max_context_length=128", "model.dtype=float32"]
    root = tmp_path / "root"
    donor = compile_model(str(families[family]), overrides=sets, out_root=root)
    nxd_sdk.CALLS.clear()
    tuned = fine_tune_copy(families[family], tmp_path / "fine-tune")
    reused = compile_model(str(tuned), overrides=sets, out_root=root)
    assert nxd_sdk.events("compile") == [] and reused.graphs_from["key"] == donor.key
    graphs = ["text_model/model.pt", "vision_model/model.pt"] if family == "llama4" else ["model.pt"]
    for graph in graphs:
        assert (reused.path / graph).stat().st_ino == (donor.path / graph).stat().st_ino
    sharded = [e for e, _ in nxd_sdk.CALLS if e.startswith("shard_")]
    assert sharded == (["shard_text_weights", "shard_vision_weights"] if family == "llama4" else ["shard_weights"])


def test_serve_commands_for_the_families(families, tmp_path, nxd_sdk):
    """vllm-neuron (0.4.1 / 0.5.0) loads every NxDI model type: a Qwen3-MoE artifact gets the plain override, a Llama 4
    one the image-to-text form its loader accepts ({text,vision}_neuron_config only) and no max_prompt_length (the
    plugin would add it to the override as max_context_length, which that form refuses), so a Llama 4 artifact whose
    prompts stop short of its length is refused; the V0 loaders (vLLM 0.9, the fork 2.24.0) have no class for the 2026
    families and are refused by name. make upstream-check runs these through the pinned parsers and validators."""
    from neuronpack.backends.vllm.targets import vllm_command
    from neuronpack.errors import ServeError
    from neuronpack.pipeline import compile_model

    sets = ["target.framework=nxd", "target.instance=trn2", "target.tp_degree=2", "target.batch_size=2",
            "target.seq_len=256"]
    for family, context in (("qwen3_moe", 128), ("llama4", 256), ("llama4", 128)):
        built = compile_model(str(families[family]), overrides=[*sets, f"target.max_context_length={context}"],
                              out_root=tmp_path / "root")
        manifest = json.loads((built.path / "neuronpack.json").read_text())
        if family == "llama4" and context < 256:
            with pytest.raises(ServeError, match="cannot take max_prompt_length for an image-to-text model"):
                vllm_command(built.path, manifest, target="vllm-neuron")
            continue
        command = vllm_command(built.path, manifest, target="vllm-neuron")
        additional = json.loads(command.argv[command.argv.index("--additional-config") + 1])
        override = additional["override_neuron_config"]
        if family == "llama4":
            assert set(override) == {"text_neuron_config", "vision_neuron_config"}
            assert "max_prompt_length" not in additional
            assert "context_encoding_buckets" in override["text_neuron_config"]
        else:
            assert override["moe_tp_degree"] == 2 and additional["max_prompt_length"] == 128
        for target in ("vllm-v0", "vllm-v0-fork"):
            with pytest.raises(ServeError, match="Neuron loader has no model class for"):
                vllm_command(built.path, manifest, target=target)


def test_the_vneuron_plugin_builds_what_its_registry_serves(families, tmp_path):
    """vneuron's architectures are the plugin's registry (less its EAGLE-3 draft): Qwen3 and gpt-oss yes, Qwen3-MoE
    (NxDI only) refused naming the registry."""
    from neuronpack.backends.vneuron.backend import ARCHITECTURES, PLUGIN_REGISTRY, VneuronBackend

    assert set(ARCHITECTURES) == set(PLUGIN_REGISTRY["0.21"]) - {"Eagle3LlamaForCausalLM"}
    path = tmp_path / "vneuron.toml"
    path.write_text('[model]\ndtype = "bfloat16"\n[target]\nframework = "vneuron"\ninstance = "trn2"\n'
                    "tp_degree = 4\nbatch_size = 2\nseq_len = 256\nmax_context_length = 128\n")
    recipe = load_recipe(path)
    assert VneuronBackend().compile_config(_request(recipe, families["qwen3"], tmp_path))["architecture"] == \
        "Qwen3ForCausalLM"
    with pytest.raises(UnsupportedModelError, match="Qwen3MoeForCausalLM is not a model neuronpack builds"):
        VneuronBackend().compile_config(_request(recipe, families["qwen3_moe"], tmp_path))


def test_doctor_and_inspect_name_the_families(families, tmp_path, nxd_sdk):
    """doctor lists the families NxDI builds and what it refuses; inspect names an artifact's NxDI class."""
    from typer.testing import CliRunner

    from neuronpack.backends.environment import environment_report
    from neuronpack.cli.app import app
    from neuronpack.pipeline import compile_model

    report = environment_report()["nxd_families"]
    assert report["built"]["Qwen3MoeForCausalLM"]["model_class"] == "NeuronQwen3MoeForCausalLM"
    assert "DeepseekV3ForCausalLM" in report["refused"] and "Gemma3ForCausalLM" in report["refused"]
    built = compile_model(str(families["gpt_oss"]), out_root=tmp_path / "root", overrides=[
        "target.framework=nxd", "target.instance=trn2", "target.tp_degree=2", "target.batch_size=2",
        "target.seq_len=256", "target.max_context_length=128"])
    out = CliRunner().invoke(app, ["inspect", str(built.path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "NeuronGptOssForCausalLM" in out.output, out.output


def test_nxd_refuses_quantized_biased_projections_with_the_skip_that_avoids_them(make_checkpoint, tmp_path, nxd_sdk):
    """Qwen2's q/k/v have biases: NxD's quantized layers cannot take them (the portable backend can, so the quantizer
    quantizes them): the nxd recipe is refused before quantizing (planned from the source) and after (read from the
    quantized checkpoint), naming the skip; with it, NxDI gets them as float in modules_to_not_convert."""
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint
    from tests.upstream.family_checkpoints import released_config

    qwen = make_checkpoint("qwen2")
    released_config(qwen)
    recipe = _recipe(tmp_path, '[quantization]\ndtype = "int8"\n')
    quantized = quantize_checkpoint(qwen, tmp_path / "q", QuantizeOptions("int8")).out
    for model_dir in (tmp_path / "not-yet", quantized):
        request = BuildRequest(model_dir=model_dir, recipe=recipe, plan=recipe.bucket_plan(), staging=tmp_path,
                               source_model_dir=qwen)
        with pytest.raises(RecipeError) as info:
            NxdBackend().compile_config(request)
        assert "k_proj, q_proj, v_proj" in info.value.what and info.value.fix.endswith(
            'skip = ["*.k_proj", "*.q_proj", "*.v_proj"] in [quantization]')
    skipping = _recipe(tmp_path, '[quantization]\ndtype = "int8"\nskip = ["*.q_proj", "*.k_proj", "*.v_proj"]\n')
    kept = quantize_checkpoint(qwen, tmp_path / "q-skip", QuantizeOptions("int8", skip=tuple(
        skipping.quantization.skip))).out
    config = NxdBackend().compile_config(BuildRequest(model_dir=kept, recipe=skipping, plan=skipping.bucket_plan(),
                                                      staging=tmp_path, source_model_dir=qwen))["neuron_config"]
    assert "layers.0.self_attn.qkv_proj.q_proj" in config["modules_to_not_convert"]
