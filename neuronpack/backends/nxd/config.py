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
from neuronpack.backends.nxd.families import FAMILIES, REFUSED, Family, architecture_of, family_of
from neuronpack.checkpoint.lora import lora_path
from neuronpack.errors import RecipeError, UnsupportedModelError

if TYPE_CHECKING:  # annotations only: a cache hit (target, versions) imports no pydantic
    from neuronpack.recipe import Recipe

EAGLE3_MIN_NXDI = (0, 7)  # NeuronConfig.is_eagle3 exists from NxDI 0.7 on; older releases drop it silently
VISION_OVERRIDES = "vision_neuron_config"  # recipe [neuron_overrides] key: the vision encoder's own fields
SAMPLING_FIELDS = ("do_sample", "top_k", "top_p", "temperature", "dynamic", "deterministic", "global_topk")
# The NeuronConfig fields an EAGLE draft conversion decides (eagle_nxd_hints also returns config-only keys)
EAGLE_FIELDS = ("enable_eagle_speculation", "enable_fused_speculation", "enable_eagle_draft_input_norm", "is_eagle3")


def nxd_neuron_config(recipe: Recipe, plan, hf_config: dict, model_dir: Path, draft_dir: Path | None,
                      source_dir: Path | None = None) -> dict:
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
    family = family_of(hf_config)
    if family is not None and family.name == "mllama":
        cfg["skip_vision"] = False  # MultimodalVisionNeuronConfig: trace the vision encoder too
    if family is not None and family.moe:
        # MoENeuronConfig: experts sharded over every rank (no expert parallelism) unless the recipe says otherwise
        cfg.update(moe_tp_degree=t.tp_degree, moe_ep_degree=1)
    options = _quantize_options(recipe, hf_config)
    if options is not None:
        cfg.update(_quantization_fields(options, model_dir, source_dir if recipe.quantization else None,
                                        fused_qkv=bool(recipe.neuron_overrides.get("fused_qkv")),
                                        kv_cache=bool(recipe.quantization and recipe.quantization.kv_cache)))
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
    cfg.update({k: v for k, v in recipe.neuron_overrides.items() if k != VISION_OVERRIDES})
    if family is not None and family.moe:
        check_expert_parallel(cfg, hf_config)
    return cfg


def vision_neuron_config(recipe: Recipe, text: dict) -> dict:
    """The vision encoder's NeuronConfig kwargs of an image-to-text model (Llama 4), as vLLM's Neuron plugin makes them:
    the text model's, with ``[neuron_overrides.vision_neuron_config]`` applied; NxDI picks the vision buckets itself
    (the text buckets do not apply to image chunks)."""
    vision = {k: v for k, v in text.items() if k not in ("context_encoding_buckets", "token_generation_buckets")}
    vision.update(recipe.neuron_overrides.get(VISION_OVERRIDES) or {})
    return vision


def check_expert_parallel(cfg: dict, hf_config: dict) -> None:
    """A MoE recipe's expert sharding: moe_tp_degree x moe_ep_degree covers the tp ranks (NxD builds its expert
    process groups as that mesh, modules/moe/moe_process_group.py) and the experts divide by moe_ep_degree."""
    tp, ep = int(cfg.get("moe_tp_degree", cfg["tp_degree"])), int(cfg.get("moe_ep_degree", 1))
    if tp * ep != cfg["tp_degree"]:
        raise RecipeError(f"moe_tp_degree {tp} x moe_ep_degree {ep} is not the tp_degree {cfg['tp_degree']}",
                          where="recipe [neuron_overrides]",
                          fix="make moe_tp_degree x moe_ep_degree = target.tp_degree")
    text = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), dict) else hf_config
    experts = next((text[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if k in text), None)
    if experts is not None and int(experts) % ep:
        raise RecipeError(f"{experts} experts do not divide over moe_ep_degree {ep}", where="recipe [neuron_overrides]",
                          fix="pick a moe_ep_degree that divides the number of experts")


def check_speculation_kind(recipe: Recipe, family: Family | None = None) -> None:
    """NxDI speculates with a draft model only (fused speculation; vLLM's Neuron loaders build it from the speculative
    config's draft model, and vllm-neuron supports EAGLE): prompt lookup has no draft, so it is refused here; so is a
    draft NxDI cannot speculate with for this ``family`` (an EAGLE head where its model class builds none, any draft
    where NxDI has no fused speculation for it)."""
    spec = recipe.speculation
    if spec is not None and spec.kind == "prompt_lookup":
        raise RecipeError('speculation kind "prompt_lookup" is not supported by NxD Inference (its fused speculation '
                          "needs a draft model; vLLM on Neuron serves draft and EAGLE speculation only)",
                          where="recipe [speculation]",
                          fix='use --framework torch (the portable backend runs prompt lookup), or kind "eagle" / '
                              '"draft" with a draft model')
    if spec is None or family is None:
        return
    if not family.fused_speculation or (spec.kind == "eagle" and family.no_eagle):
        raise RecipeError(f"NxD Inference cannot speculate with a {spec.kind} draft for {family.name}: "
                          f"{family.no_eagle}", where="recipe [speculation]",
                          fix="drop the [speculation] section" + ("" if not family.fused_speculation else
                                                                  ', or use kind "draft" (a small model of the '
                                                                  "same family)"))


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


def model_family(hf_config: dict, *, where: str) -> Family | None:
    """The NxDI family of the checkpoint; None when its config is not readable yet (dry-run before quantizing).
    UnsupportedModelError for an architecture NxDI has no class for, or one refused by name (families.REFUSED)."""
    if not hf_config:
        return None
    arch = architecture_of(hf_config)
    refusal = REFUSED.get(arch or "")
    if refusal is not None and refusal.judged:  # accepted only when this machine's NxDI passes the CPU judge
        from neuronpack.backends.nxd.defects import JUDGED, judge

        verdict = judge(arch)
        if verdict.accepted:
            return JUDGED[arch][0]
        raise UnsupportedModelError(f"{arch} is refused for NxD Inference: {refusal.what}; this machine's "
                                    f"verdict: {verdict.detail}", where=where, fix=refusal.fix)
    if refusal is not None:
        raise UnsupportedModelError(f"{arch} is refused for NxD Inference: {refusal.what}", where=where,
                                    fix=refusal.fix)
    if arch not in FAMILIES:
        raise UnsupportedModelError(
            f"NxD Inference backend has no model class for architecture {arch!r}", where=where,
            fix=f"supported: {', '.join(FAMILIES)}; or use --framework torch")
    return FAMILIES[arch]


def model_class_path(hf_config: dict, *, where: str) -> str | None:
    """The NxDI class for the checkpoint (see model_family)."""
    family = model_family(hf_config, where=where)
    return None if family is None else family.model_class


# --- private ---------------------------------------------------------------------------------------------------------
_QKV = re.compile(r"(.*\bself_attn)\.([qkv]_proj)")


def _quantize_options(recipe: Recipe, hf_config: dict):
    """How the weights NxDI loads are quantized: the recipe's ``[quantization]``, else the section ``neuronpack
    quantize`` wrote into the checkpoint's config.json (compiled as float, NxDI would read its int8 / fp8 values as
    floats and drop the scales); None for float weights."""
    from neuronpack.convert.quant_options import QuantizeOptions

    if recipe.quantization is not None:
        options, where = QuantizeOptions.from_recipe(recipe.quantization), "recipe [quantization] include_experts"
    else:
        options = QuantizeOptions.from_checkpoint_config(hf_config)
        if options is None:
            return None
        where = "the checkpoint's config.json quantization.include_experts"
    if options.include_experts:  # NxDI's MoE converters fuse the experts from float weights and drop their scales
        raise RecipeError("NxD Inference cannot load quantized MoE experts (its converters fuse them from float "
                          "weights and drop the scales)", where=where,
                          fix="quantize without --include-experts / include_experts (the experts stay float)")
    return options


def _quantization_fields(options, model_dir: Path, source_dir: Path | None, *, fused_qkv: bool, kv_cache: bool
                         ) -> dict:
    """``options``: a QuantizeOptions; ``model_dir``: the quantized checkpoint (absent before a dry-run quantizes);
    ``source_dir``: what it is made from, planned instead while the quantized one is not there yet."""
    from neuronpack.convert.quantize import nxd_quantization_fields, quantized_biased_projections

    biased = quantized_biased_projections(options, Path(model_dir), source_dir)
    if biased:  # NxD's quantized layers cannot take the bias NxDI's attention rewrites (quant_plan.py)
        kinds = sorted({prefix.rsplit(".", 1)[-1] for prefix in biased})
        raise RecipeError(
            f"NxD Inference cannot load a quantized attention projection with a bias ({', '.join(kinds)} of "
            f"{len(biased)} layer(s)): NxDI rewrites the bias in its preshard hook and NxD's quantized layers cannot "
            "take it (neuronx_distributed/quantization/quantization_layers.py:419)", where="recipe [quantization]",
            fix="keep them float: skip = [" + ", ".join(f'"*.{kind}"' for kind in kinds) + "] in [quantization]")
    fields = nxd_quantization_fields(options, Path(model_dir), source_dir)
    if fields.get("modules_to_not_convert") is not None:  # NxDI's names; keep order, drop repeats
        fields["modules_to_not_convert"] = nxd_module_names(fields["modules_to_not_convert"], fused_qkv=fused_qkv)
    fields["kv_cache_quant"] = kv_cache
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
