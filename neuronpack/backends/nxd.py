"""The NxD Inference backend (``neuronx-distributed-inference``): recipe -> NeuronConfig, compile, artifact checks.

Written against NxDI 0.9's documented API and source (``models/config.py``, ``models/application_base.py``) and
vLLM 0.9's loader (``vllm/model_executor/model_loader/neuronx_distributed.py``); proven by contract tests with a
stand-in SDK, never run on Neuron hardware here.

The compile is what vLLM would do on its first start, done ahead of time::

    neuron_config = model_cls.get_neuron_config_cls()(**kwargs)
    config = model_cls.get_config_cls()(neuron_config, load_config=load_pretrained_config(model_dir))
    model_cls(model_dir, config).compile(staging)   # neuron_config.json, model.pt, weights/tp{rank}_...

Example::

    backend = NxdBackend()
    backend.compile_config(request)["neuron_config"]["context_encoding_buckets"]   # [128, 256, ..., 8192]
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.backends.base import Availability, BuildRequest
from neuronpack.backends.neuron_common import (
    import_class,
    model_dtype,
    neuron_instance,
    read_model_config,
    version_tuple,
    working_directory,
)
from neuronpack.backends.neuron_packages import sdk_availability, versions_of
from neuronpack.checkpoint.lora import copy_adapters, lora_path
from neuronpack.errors import ArtifactError, BuildError, RecipeError, UnsupportedModelError

if TYPE_CHECKING:  # annotations only: a cache hit (target, versions) imports no pydantic
    from neuronpack.artifacts.manifest import Manifest
    from neuronpack.recipe import Recipe

NXD_DISTS = ("neuronx-distributed-inference", "neuronx-cc", "torch-neuronx")
_MODELS = "neuronx_distributed_inference.models"
# HF architecture -> NxDI class, as vLLM 0.9 maps them (Mistral runs on the Llama implementation)
MODEL_CLASSES: dict[str, str] = {
    "LlamaForCausalLM": f"{_MODELS}.llama.modeling_llama.NeuronLlamaForCausalLM",
    "MistralForCausalLM": f"{_MODELS}.llama.modeling_llama.NeuronLlamaForCausalLM",
    "Qwen2ForCausalLM": f"{_MODELS}.qwen2.modeling_qwen2.NeuronQwen2ForCausalLM",
    "MixtralForCausalLM": f"{_MODELS}.mixtral.modeling_mixtral.NeuronMixtralForCausalLM",
    "DbrxForCausalLM": f"{_MODELS}.dbrx.modeling_dbrx.NeuronDbrxForCausalLM",
    # Llama-3.2 multimodal: NxDI's own class (MllamaInferenceConfig + MultimodalVisionNeuronConfig); the vision
    # encoder is traced with the text buckets, its tile count comes from the checkpoint's vision_config
    "MllamaForConditionalGeneration": f"{_MODELS}.mllama.modeling_mllama.NeuronMllamaForCausalLM",
}
MULTIMODAL = ("MllamaForConditionalGeneration",)
EAGLE3_MIN_NXDI = (0, 7)  # NeuronConfig.is_eagle3 exists from NxDI 0.7 on; older releases drop it silently
SAMPLING_FIELDS = ("do_sample", "top_k", "top_p", "temperature", "dynamic", "deterministic", "global_topk")
# The NeuronConfig fields an EAGLE draft conversion decides (eagle_nxd_hints also returns config-only keys)
EAGLE_FIELDS = ("enable_eagle_speculation", "enable_fused_speculation", "enable_eagle_draft_input_norm", "is_eagle3")
COMPILED_FILES = ("neuron_config.json", "model.pt")


class NxdBackend:
    """Backend protocol implementation for NxD Inference. See the module docstring."""

    name = "nxd"
    quantizes_on_load = False

    def availability(self) -> Availability:
        return sdk_availability("neuronx_distributed_inference")

    def versions(self) -> dict[str, str]:
        return versions_of(NXD_DISTS)

    def target(self, recipe: Recipe) -> dict[str, Any]:
        instance = neuron_instance(recipe, "nxd")
        overrides = recipe.neuron_overrides
        return {
            "instance": instance,
            "platform_target": instance,  # NEURON_PLATFORM_TARGET_OVERRIDE
            "logical_nc_config": overrides.get("logical_nc_config"),
            "nodes": recipe.target.nodes,
        }

    def compile_config(self, request: BuildRequest) -> dict[str, Any]:
        """Everything the compile hands NxDI, JSON-able: the exact NeuronConfig kwargs, the class, the draft's."""
        recipe, plan = request.recipe, request.plan
        neuron_instance(recipe, "nxd")  # a CPU recipe is refused for its instance first
        check_speculation_kind(recipe)
        # Before offline quantization has run (dry-run), the quantized directory does not exist yet: read the
        # architecture from the checkpoint it will be made from.
        config_dir = request.model_dir
        if not Path(config_dir).exists() and request.source_model_dir is not None:
            config_dir = request.source_model_dir
        hf_config = read_model_config(config_dir, allow_missing=recipe.quantization is not None)
        neuron_config = nxd_neuron_config(recipe, plan, hf_config, request.model_dir, request.draft_dir)
        check_eagle3_supported(neuron_config, self.versions().get("neuronx-distributed-inference"))
        out: dict[str, Any] = {
            "architecture": architecture_of(hf_config),
            "model_class": model_class_path(hf_config, where=str(request.model_dir)),
            "platform_target": neuron_instance(recipe, "nxd"),
            "neuron_config": neuron_config,
        }
        if recipe.speculation is not None:
            out["draft"] = {
                "path": None if request.draft_dir is None else str(request.draft_dir),
                "neuron_config": draft_neuron_config(neuron_config),
            }
        if architecture_of(hf_config) in MULTIMODAL:
            out["vision"] = vision_plan(hf_config)
        if recipe.target.nodes > 1:
            out["multi_node"] = {"nodes": recipe.target.nodes,
                                 "local_ranks_size": recipe.target.tp_degree // recipe.target.nodes}
        return out

    def build(self, request: BuildRequest) -> dict[str, Any]:
        """Compile with NxDI into request.staging (needs the SDK; the platform target comes from the recipe)."""
        availability = self.availability()
        if not availability.ok:
            raise BuildError(f"NxD Inference cannot build here: {availability.reason}", where="framework nxd",
                             fix="compile on a machine with the Neuron SDK, or use --dry-run / --framework torch")
        # absolute paths: the compile runs inside the staging directory (see below)
        request = dataclasses.replace(
            request, model_dir=Path(request.model_dir).absolute(), staging=Path(request.staging).absolute(),
            draft_dir=None if request.draft_dir is None else Path(request.draft_dir).absolute())
        config = self.compile_config(request)
        os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = config["platform_target"]
        model_cls = import_class(config["model_class"])
        copy_lora_adapters(request)
        # lora_ckpt_paths are relative to the artifact: NxDI checks them at compile and at every load, so both run
        # with the artifact as working directory (serve starts vLLM there too)
        with request.reporter.task(f"NxDI compile ({config['architecture']}, tp {request.recipe.target.tp_degree})"), \
                working_directory(request.staging):
            model = model_cls(str(request.model_dir), _inference_config(model_cls, config, request))
            model.compile(str(request.staging))
        check_compiled(request.staging, config["neuron_config"])
        _copy_model_files(request)
        return {"nxd": {"model_class": config["model_class"], "platform_target": config["platform_target"]}}

    def validate_artifact(self, artifact_dir: Path, manifest: Manifest) -> None:
        """Files NxDI's load() reads are present, and this machine's NxDI / compiler / torch-neuronx are the ones
        the artifact was built with (NxDI itself records no compiler version)."""
        neuron_config = manifest.compile_config.get("neuron_config") or {}
        check_compiled(Path(artifact_dir), neuron_config)
        check_lora_adapters(Path(artifact_dir), neuron_config)
        if not neuron_config.get("save_sharded_checkpoint", False):
            model_path = Path(manifest.model.path or "")
            if not (model_path / "config.json").is_file():
                raise ArtifactError(
                    "this artifact shards weights on load and its checkpoint is gone",
                    where=str(model_path), fix="restore the checkpoint or rebuild with save_sharded_checkpoint=true")
        built, here = manifest.versions, self.versions()
        for dist in NXD_DISTS:
            if dist in built and built[dist] != here.get(dist):
                raise ArtifactError(
                    f"built with {dist} {built[dist]}, this machine has {here.get(dist)}", where=str(artifact_dir),
                    fix=f"install {dist}=={built[dist]} from the Neuron repository or rebuild here")


# --- the mapping (pure, torch-free) ----------------------------------------------------------------------------------
def nxd_neuron_config(recipe: Recipe, plan, hf_config: dict, model_dir: Path, draft_dir: Path | None) -> dict:
    """The exact NeuronConfig kwargs for a recipe, starting from vLLM's defaults so the artifact matches what vLLM
    would compile; ``recipe.neuron_overrides`` is applied last as a shallow update (like vLLM's override).

    Example::

        nxd_neuron_config(load_recipe(Path("recipes/llama-3.2-1b-inf2.toml")), plan, {}, ckpt, None)["seq_len"]
        # 4096
    """
    t = recipe.target
    cfg: dict[str, Any] = {
        "tp_degree": t.tp_degree,
        "batch_size": t.batch_size,
        "ctx_batch_size": 1,  # vLLM encodes one prompt at a time with continuous batching
        "tkg_batch_size": t.batch_size,
        "max_context_length": plan.max_context_length,
        "seq_len": plan.seq_len,
        "torch_dtype": model_dtype(recipe, hf_config),
        "enable_bucketing": recipe.buckets.enabled,
        "is_continuous_batching": True,
        "padding_side": "right",
        "sequence_parallel_enabled": True,
        "on_device_sampling_config": sampling_config(recipe),
        "save_sharded_checkpoint": True,  # weights travel inside the artifact: no checkpoint needed to serve
        "quantized": False,
    }
    if recipe.buckets.enabled:
        cfg["context_encoding_buckets"] = list(plan.context)
        cfg["token_generation_buckets"] = list(plan.token_generation)
    if architecture_of(hf_config) in MULTIMODAL:
        cfg["skip_vision"] = False  # MultimodalVisionNeuronConfig: trace the vision encoder too
    if recipe.quantization is not None:
        cfg.update(_quantization_fields(recipe, model_dir, fused_qkv=bool(recipe.neuron_overrides.get("fused_qkv"))))
    if recipe.speculation is not None:
        cfg.update(_speculation_fields(recipe, draft_dir))
    if recipe.lora is not None:
        lora = recipe.lora
        cfg["lora_config"] = {"max_loras": lora.max_loras, "max_lora_rank": lora.max_rank,
                              "target_modules": list(lora.target_modules),
                              "lora_ckpt_paths": {a.name: lora_path(a.name) for a in lora.adapters}}
    if t.nodes > 1:
        # Shard weights for every rank so one artifact serves all nodes; each node loads its own ranks
        # (vllm_launch passes start_rank_id / local_ranks_size per node).
        cfg["start_rank_id"] = 0
        cfg["local_ranks_size"] = t.tp_degree
    cfg.update(recipe.neuron_overrides)
    return cfg


def check_speculation_kind(recipe: Recipe) -> None:
    """NxDI speculates with a draft model only (fused speculation; vLLM's Neuron loaders build it from the speculative
    config's draft model, and vllm-neuron supports EAGLE): prompt lookup has no draft, so it is refused here."""
    spec = recipe.speculation
    if spec is not None and spec.kind == "prompt_lookup":
        raise RecipeError('speculation kind "prompt_lookup" is not supported by NxD Inference (its fused speculation '
                          "needs a draft model; vLLM on Neuron serves draft and EAGLE speculation only)",
                          where="recipe [speculation]",
                          fix='use --framework torch (the portable backend runs prompt lookup), or kind "eagle" / '
                              '"draft" with a draft model')


def sampling_config(recipe: Recipe) -> dict | None:
    """OnDeviceSamplingConfig kwargs, or None when sampling runs on the host."""
    s = recipe.sampling
    if not s.on_device:
        return None
    return {name: getattr(s, name) for name in SAMPLING_FIELDS}


def draft_neuron_config(target: dict) -> dict:
    """The draft's NeuronConfig fields, derived from the target's as vLLM (V0 loader and vllm-neuron) and NxDI's
    inference_demo do it. Shown by --dry-run; the build applies the same changes to a deep copy of the target's
    NeuronConfig object (``_draft_config_object``), never ``NeuronConfig(**this)``: its __init__ turns
    enable_fused_speculation back on whenever enable_eagle_speculation is set."""
    draft = dict(target)
    eagle = bool(target.get("enable_eagle_speculation"))
    if not eagle:
        draft["speculation_length"] = 0
    draft["enable_fused_speculation"] = False
    if target.get("draft_model_modules_to_not_convert"):
        draft["modules_to_not_convert"] = target["draft_model_modules_to_not_convert"]
    if eagle:
        draft["is_eagle_draft"] = True
        draft["sequence_parallel_enabled"] = False
    return draft


def check_eagle3_supported(neuron_config: dict, nxdi_version: str | None) -> None:
    """EAGLE-3 needs NeuronConfig.is_eagle3, which exists from NxDI 0.7 on (older releases log it as unexpected and
    drop it, then run the draft as EAGLE-1). Unknown version (dry-run on a build box): nothing to check."""
    have = version_tuple(nxdi_version)
    if neuron_config.get("is_eagle3") and have and have < EAGLE3_MIN_NXDI:
        raise UnsupportedModelError(
            f"EAGLE-3 drafts need neuronx-distributed-inference >= 0.7; this machine has {nxdi_version}, which drops "
            "is_eagle3", where="speculation.draft",
            fix="install NxDI 0.7 or newer (Neuron SDK 2.27+), or use an EAGLE-1/2 draft")


def vision_plan(hf_config: dict) -> dict:
    """What the Mllama vision encoder is traced for (NxDI reads these from vision_config; shown by --dry-run)."""
    vision = hf_config.get("vision_config") or {}
    return {"max_num_tiles": vision.get("max_num_tiles"), "image_size": vision.get("image_size"),
            "patch_size": vision.get("patch_size"), "buckets": "the text context-encoding buckets"}


def nxd_module_names(modules: list[str], *, fused_qkv: bool) -> list[str]:
    """Skip-list entries in NxDI's module names (matched by substring against them): attention projections live
    under ``self_attn.qkv_proj`` (``.q_proj``/``.k_proj``/``.v_proj``, or one ``.Wqkv`` with fused_qkv). A single
    q/k/v skip is rewritten to that form; with fused_qkv it is widened to the whole ``self_attn`` block (q, k and v
    are one weight there), and so is any projection skip naming a layer's o_proj's siblings.

    Example::

        nxd_module_names(["lm_head", "layers.3.self_attn.q_proj"], fused_qkv=False)
        # ["lm_head", "layers.3.self_attn.qkv_proj.q_proj"]
        nxd_module_names(["layers.3.self_attn.k_proj"], fused_qkv=True)   # ["layers.3.self_attn"]
    """
    out = []
    for name in modules:
        match = _QKV.fullmatch(name)
        if match:
            block, proj = match.group(1), match.group(2)
            name = block if fused_qkv else f"{block}.qkv_proj.{proj}"
        out.append(name)
    return list(dict.fromkeys(out))


def copy_lora_adapters(request: BuildRequest) -> None:
    """Copy every recipe adapter into ``staging/lora/<name>/`` so the artifact carries them (NxDI re-checks each
    lora_ckpt_paths entry whenever neuron_config.json is loaded; build-time paths would be gone on the server)."""
    dirs = request.adapter_dirs()
    copy_adapters(dirs, request.staging, {name: lora_path(name) for name in dirs})


def check_lora_adapters(artifact_dir: Path, neuron_config: dict) -> None:
    """Every adapter in lora_config.lora_ckpt_paths is inside the artifact and present (else vLLM's load raises
    FileNotFoundError and it recompiles)."""
    paths = ((neuron_config.get("lora_config") or {}).get("lora_ckpt_paths") or {})
    for name, rel in sorted(paths.items()):
        path = Path(artifact_dir) / str(rel)
        if Path(str(rel)).is_absolute() or ".." in Path(str(rel)).parts or not path.exists():
            raise ArtifactError(f"LoRA adapter {name!r} is not inside the artifact ({rel})", where=str(artifact_dir),
                                fix="rebuild it with `neuronpack compile --force` (adapters are copied in)")


def architecture_of(hf_config: dict) -> str | None:
    archs = hf_config.get("architectures") or []
    return next((a for a in archs if a in MODEL_CLASSES), archs[0] if archs else None)


def model_class_path(hf_config: dict, *, where: str) -> str | None:
    """The NxDI class for the checkpoint; None when its config is not readable yet (dry-run before quantizing)."""
    if not hf_config:
        return None
    arch = architecture_of(hf_config)
    if arch not in MODEL_CLASSES:
        raise UnsupportedModelError(
            f"NxD Inference backend has no model class for architecture {arch!r}", where=where,
            fix=f"supported: {', '.join(MODEL_CLASSES)}; or use --framework torch")
    return MODEL_CLASSES[arch]


def check_compiled(artifact_dir: Path, neuron_config: dict) -> None:
    """The files NxDI's compile writes and its load reads: neuron_config.json, model.pt, weights/tp{rank}_*."""
    for name in COMPILED_FILES:
        if not (artifact_dir / name).is_file():
            raise ArtifactError(f"NxDI artifact is missing {name}", where=str(artifact_dir / name),
                                fix="rebuild it with `neuronpack compile --force`")
    if neuron_config.get("save_sharded_checkpoint"):
        world = int(neuron_config.get("world_size") or neuron_config.get("tp_degree") or 1)
        for rank in range(world):
            shard = artifact_dir / "weights" / f"tp{rank}_sharded_checkpoint.safetensors"
            if not shard.is_file():
                raise ArtifactError(f"NxDI artifact is missing the rank {rank} weights", where=str(shard),
                                    fix="rebuild it with `neuronpack compile --force`")


# --- private ---------------------------------------------------------------------------------------------------------
_QKV = re.compile(r"(.*\bself_attn)\.([qkv]_proj)")


def _quantization_fields(recipe: Recipe, model_dir: Path, *, fused_qkv: bool) -> dict:
    from neuronpack.convert.quantize import QuantizeOptions, nxd_quantization_fields

    options = QuantizeOptions.from_recipe(recipe.quantization)
    fields = nxd_quantization_fields(options, Path(model_dir))
    if fields.get("modules_to_not_convert") is not None:  # NxDI's names; keep order, drop repeats
        fields["modules_to_not_convert"] = nxd_module_names(fields["modules_to_not_convert"], fused_qkv=fused_qkv)
    fields["kv_cache_quant"] = bool(recipe.quantization.kv_cache)
    return fields


def _speculation_fields(recipe: Recipe, draft_dir: Path | None) -> dict:
    spec = recipe.speculation
    fields: dict[str, Any] = {"speculation_length": spec.length, "enable_fused_speculation": True}
    if spec.kind == "eagle":
        fields.update({"enable_eagle_speculation": True})
        if draft_dir is not None and Path(draft_dir).exists():
            from neuronpack.convert.eagle import eagle_nxd_hints

            hints = eagle_nxd_hints(Path(draft_dir))
            fields.update({k: hints[k] for k in EAGLE_FIELDS if k in hints})
    return fields


def _inference_config(model_cls, config: dict, request: BuildRequest):
    """NeuronConfig + InferenceConfig (and the FusedSpecNeuronConfig for speculation), as vLLM 0.9 builds them."""
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    neuron_config = model_cls.get_neuron_config_cls()(**config["neuron_config"])
    inference_config = model_cls.get_config_cls()(
        neuron_config, load_config=load_pretrained_config(str(request.model_dir)))
    if "draft" in config:
        from neuronx_distributed_inference.models.config import FusedSpecNeuronConfig

        if request.draft_dir is None:
            raise BuildError("the recipe speculates but no draft was resolved", where="speculation.draft",
                             fix="set [speculation] draft to a local directory or cached hub id")
        draft_config = model_cls.get_config_cls()(
            _draft_config_object(neuron_config), load_config=load_pretrained_config(str(request.draft_dir)))
        inference_config.fused_spec_config = FusedSpecNeuronConfig(
            model_cls._model_cls, draft_config=draft_config, draft_model_path=str(request.draft_dir))
    return inference_config


def _draft_config_object(target):
    """The draft NeuronConfig as upstream builds it: deep copy of the target's object, then attributes set (see
    draft_neuron_config; NeuronConfig(**dict) would flip enable_fused_speculation back on for EAGLE)."""
    draft = copy.deepcopy(target)
    for name, value in draft_neuron_config(vars(target)).items():
        if getattr(draft, name, object()) != value and name in _DRAFT_FIELDS:
            setattr(draft, name, value)
    return draft


_DRAFT_FIELDS = ("speculation_length", "enable_fused_speculation", "modules_to_not_convert", "is_eagle_draft",
                 "sequence_parallel_enabled")


def _copy_model_files(request: BuildRequest) -> None:
    """config.json + tokenizer/generation files next to the compiled model (vLLM reads them from --model), and the
    draft's config under draft/ so the artifact alone can be served."""
    from neuronpack.checkpoint import copy_aux_files

    shutil.copy2(Path(request.model_dir) / "config.json", request.staging / "config.json")
    copy_aux_files(Path(request.model_dir), request.staging)
    if request.draft_dir is not None:
        draft_out = request.staging / "draft"
        draft_out.mkdir(exist_ok=True)
        shutil.copy2(Path(request.draft_dir) / "config.json", draft_out / "config.json")
        copy_aux_files(Path(request.draft_dir), draft_out)
