"""The NxD Inference backend's mapping, recipe -> NeuronConfig kwargs (pure, torch-free: ``--dry-run`` and the key
run it without the SDK): the model class of an architecture, the NeuronConfig, the draft's, and the checks a recipe
must pass for NxDI. nxd.py compiles with them.

Example::

    nxd_neuron_config(load_recipe(Path("recipes/llama-3.2-1b-inf2.toml")), plan, {}, ckpt, None)["seq_len"]   # 4096
    model_class_path({"architectures": ["LlamaForCausalLM"]}, where="ckpt")   # "...NeuronLlamaForCausalLM"
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.backends.neuron.common import model_dtype, version_tuple
from neuronpack.checkpoint.lora import lora_path
from neuronpack.errors import RecipeError, UnsupportedModelError

if TYPE_CHECKING:  # annotations only: a cache hit (target, versions) imports no pydantic
    from neuronpack.recipe import Recipe

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
