"""The model families the nxd backend builds, read from NxD Inference 0.9.0's source: for each Hugging Face
architecture, NxDI's application class, the config classes it reads, and what NxDI can and cannot do with it
(speculation, a checkpoint layout it requires); and the architectures refused by name, with the reason found in
upstream. Torch-free data: ``--dry-run``, the key and ``doctor`` read it without the SDK.

File and line references are NxDI 0.9.0's (``../shared/upstream``, commit 4bcdc54), under
``src/neuronx_distributed_inference/``; docs/neuron.md has the support matrix made from this table.

Example::

    family_of({"architectures": ["Qwen3MoeForCausalLM"]}).model_class
    # "neuronx_distributed_inference.models.qwen3_moe.modeling_qwen3_moe.NeuronQwen3MoeForCausalLM"
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

_MODELS = "neuronx_distributed_inference.models"
# what `neuronpack convert-eagle` writes: Llama-layout EAGLE-1/2/3 heads, built by NxDI with the target's model class
_EAGLE_LAYOUT = "convert-eagle writes Llama-layout EAGLE heads"


@dataclass(frozen=True)
class Family:
    """One NxDI model family: how neuronpack builds a checkpoint of it and what NxDI supports for it."""

    name: str  # NxDI's model type (utils/constants.py MODEL_TYPES), e.g. "qwen3_moe"
    model_class: str  # the NxDI application class, dotted
    config_classes: str  # the InferenceConfig / NeuronConfig classes that class reads (get_config_cls)
    moe: bool = False  # a MoENeuronConfig: expert-parallel / tensor-parallel degrees of the experts
    # None: an EAGLE draft (what convert-eagle writes) can serve this target in NxDI's fused speculation; else why not
    no_eagle: str | None = None
    fused_speculation: bool = True  # False: NxDI refuses any draft (no_eagle says why), EAGLE or a draft model
    # NxDI's image-to-text application (a text and a vision NeuronConfig): the text-decoder class it builds its text
    # model from, which the CPU check runs on the checkpoint's text_config
    text_class: str | None = None
    required_keys: tuple[str, ...] = ()  # config.json keys NxDI's config class requires beyond transformers' own


@dataclass(frozen=True)
class Refusal:
    """An architecture the nxd backend refuses, and why (upstream's file and line)."""

    what: str
    fix: str
    judged: bool = False  # refused unless the installed NxDI passes the family's CPU judge (defects.py)


def nxdi_class(module: str, name: str) -> str:
    return f"{_MODELS}.{module}.{name}"


_NO_FC = ("NxDI builds the draft with the target's model class, and {cls} makes no EAGLE `fc` layer (only the "
          "Llama and gpt-oss models read is_eagle_draft: models/llama/modeling_llama.py:1161, "
          "models/gpt_oss/modeling_gpt_oss.py:964)")
FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family("llama", nxdi_class("llama.modeling_llama", "NeuronLlamaForCausalLM"),
                               "LlamaInferenceConfig, NeuronConfig"),
    # Mistral runs on NxDI's Llama class, as vLLM 0.9 mapped it (NxDI's own Mistral class agrees with it on the CPU,
    # sliding window included: docs/neuron.md)
    "MistralForCausalLM": Family("llama", nxdi_class("llama.modeling_llama", "NeuronLlamaForCausalLM"),
                                 "LlamaInferenceConfig, NeuronConfig"),
    "Qwen2ForCausalLM": Family("qwen2", nxdi_class("qwen2.modeling_qwen2", "NeuronQwen2ForCausalLM"),
                               "Qwen2InferenceConfig, Qwen2NeuronConfig",
                               no_eagle=_NO_FC.format(cls="NeuronQwen2Model")),
    "Qwen3ForCausalLM": Family("qwen3", nxdi_class("qwen3.modeling_qwen3", "NeuronQwen3ForCausalLM"),
                               "Qwen3InferenceConfig, Qwen3NeuronConfig",
                               no_eagle=_NO_FC.format(cls="NeuronQwen3Model")),
    "Qwen3MoeForCausalLM": Family("qwen3_moe", nxdi_class("qwen3_moe.modeling_qwen3_moe", "NeuronQwen3MoeForCausalLM"),
                                  "Qwen3MoeInferenceConfig, MoENeuronConfig", moe=True,
                                  no_eagle=_NO_FC.format(cls="NeuronQwen3MoeModel")),
    "GptOssForCausalLM": Family(
        "gpt_oss", nxdi_class("gpt_oss.modeling_gpt_oss", "NeuronGptOssForCausalLM"),
        "GptOssInferenceConfig, GptOssNeuronConfig (a MoENeuronConfig)", moe=True,
        no_eagle=(f"NxDI builds a gpt-oss target's draft with NeuronGptOssModel (sinks, MoE; "
                  f"models/gpt_oss/modeling_gpt_oss.py:964), and {_EAGLE_LAYOUT}, which do not load into it"),
        required_keys=("initial_context_length",)),
    "MixtralForCausalLM": Family("mixtral", nxdi_class("mixtral.modeling_mixtral", "NeuronMixtralForCausalLM"),
                                 "MixtralInferenceConfig, MoENeuronConfig", moe=True,
                                 no_eagle=_NO_FC.format(cls="NeuronMixtralModel")),
    "DbrxForCausalLM": Family("dbrx", nxdi_class("dbrx.modeling_dbrx", "NeuronDbrxForCausalLM"),
                              "DbrxInferenceConfig, MoENeuronConfig", moe=True,
                              no_eagle=_NO_FC.format(cls="NeuronDbrxModel")),
    # Llama-3.2 multimodal: MllamaInferenceConfig + MultimodalVisionNeuronConfig; the vision encoder is traced with
    # the text buckets, its tile count comes from the checkpoint's vision_config
    "MllamaForConditionalGeneration": Family("mllama", nxdi_class("mllama.modeling_mllama", "NeuronMllamaForCausalLM"),
                                             "MllamaInferenceConfig, MultimodalVisionNeuronConfig",
                                             no_eagle="NxDI's Mllama has no fused speculation",
                                             fused_speculation=False),
    # Llama 4 (Scout, Maverick) in Meta's multimodal layout, as vLLM's Neuron plugin serves it: NxDI's image-to-text
    # class, the text decoder and the vision encoder each with its NeuronConfig
    "Llama4ForConditionalGeneration": Family(
        "llama4", nxdi_class("llama4.modeling_llama4", "NeuronLlama4ForCausalLM"),
        "Llama4InferenceConfig, Llama4NeuronConfig (a MoENeuronConfig) for the text and the vision model", moe=True,
        no_eagle=("NxDI's Llama 4 refuses fused speculation (\"Llama4 does not yet support fused speculation.\", "
                  "models/llama4/modeling_llama4.py:102)"), fused_speculation=False,
        text_class=nxdi_class("llama4.modeling_llama4_text", "NeuronLlama4TextForCausalLM")),
}
_GEMMA3_DEFECTS = (
    "NxDI 0.9.0's Gemma 3 computes wrong logits (on the judge's tiny Gemma 3 its CPU run agrees with transformers on "
    "0 of 19 top-1 tokens, logits off by up to 6): "
    "(1) the model never sets its sliding_window, so context encoding gives the sliding-window layers the full causal "
    "mask (models/model_base.py:794 never runs; NeuronGemma3TextModel.setup_attr_for_model, "
    "models/gemma3/modeling_gemma3.py:278); (2) every layer gets layer 0's rotary cos/sin (models/model_base.py:1394), "
    "so the global layers use the local rope (modules/attention/attention_base.py:474 recomputes only when None)")
REFUSED: dict[str, Refusal] = {
    "Gemma3ForCausalLM": Refusal(_GEMMA3_DEFECTS, judged=True,
                                 fix="install an NxD Inference that fixes both (compile judges it with the same CPU "
                                     "run on a tiny Gemma 3), or use --framework torch"),
    "Gemma3ForConditionalGeneration": Refusal(
        "NxDI 0.9.0 has a Gemma 3 text class only (models/gemma3/modeling_gemma3.py), and it is wrong: "
        + _GEMMA3_DEFECTS.split(": ", 1)[1], fix="use --framework torch for the text model"),
    "DeepseekV3ForCausalLM": Refusal(
        "NxDI 0.9.0 has no DeepSeek-V3 model class (models/deepseek/modeling_deepseek.py holds only its config, "
        "RMSNorm and attention)", fix="use another framework, or an NxD Inference release with a DeepSeek-V3 class"),
    "Llama4ForCausalLM": Refusal(
        "a text-only Llama 4 checkpoint: NxDI 0.9.0's Llama 4 reads Meta's multimodal layout only (text_config.*, "
        "models/llama4/modeling_llama4_text.py:250)",
        fix="compile the released Llama4ForConditionalGeneration checkpoint (its text decoder and vision encoder)"),
}
# gpt-oss's released expert layout, the only one NxDI's converter reads (models/gpt_oss/modeling_gpt_oss.py:206)
MXFP4_SUFFIXES = ("mlp.experts.gate_up_proj_blocks", "mlp.experts.gate_up_proj_scales",
                  "mlp.experts.down_proj_blocks", "mlp.experts.down_proj_scales")
DEQUANTIZED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def architecture_of(hf_config: dict) -> str | None:
    """The first architecture the nxd backend knows (built or refused), else the checkpoint's first."""
    archs = hf_config.get("architectures") or []
    return next((a for a in archs if a in FAMILIES or a in REFUSED), archs[0] if archs else None)


def family_of(hf_config: dict) -> Family | None:
    return FAMILIES.get(architecture_of(hf_config) or "")


def checkpoint_problem(arch: str | None, hf_config: dict, tensor_names: Iterable[str]) -> tuple[str, str] | None:
    """(what, fix) when NxDI would refuse this checkpoint of a known family, else None: gpt-oss must carry the
    released MXFP4 experts (a bf16-dequantized copy has none, and NxDI's converter reads only ``*_blocks`` /
    ``*_scales``) and ``initial_context_length`` (NxDI's config class requires it); Llama 4 must hold its
    text_config."""
    family = FAMILIES.get(arch or "")
    if family is None:
        return None
    names = list(tensor_names)
    if family.name == "gpt_oss" and names and not any(n.endswith(MXFP4_SUFFIXES) for n in names):
        dequantized = any(n.endswith(DEQUANTIZED_EXPERTS) for n in names)
        return (("a gpt-oss checkpoint with bf16-dequantized experts" if dequantized else
                 "a gpt-oss checkpoint without MXFP4 experts")
                + ": NxDI 0.9.0's converter reads only the released MXFP4 layout (mlp.experts.*_blocks / *_scales, "
                "models/gpt_oss/modeling_gpt_oss.py:206) and dequantizes it itself",
                "compile the released checkpoint (openai/gpt-oss-20b, openai/gpt-oss-120b) as it is")
    if family.text_class and not isinstance(hf_config.get("text_config"), dict):
        return ("a Llama 4 config.json without text_config", "use Meta's released Llama4ForConditionalGeneration "
                "config.json")
    text = hf_config["text_config"] if family.text_class else hf_config
    missing = [key for key in family.required_keys if key not in text]
    if missing:
        return (f"config.json has no {', '.join(missing)}, which NxDI's {family.config_classes.split(',')[0]} "
                "requires", f"use the released config.json (it has {', '.join(missing)})")
    return None


def transformers4_overrides(hf_config: dict) -> dict:
    """InferenceConfig kwargs for what a transformers 5 config.json names otherwise than transformers 4.57 (NxDI
    0.9.0's pin, which reads config.json) does: ``rope_parameters`` -> ``rope_theta`` and ``rope_scaling`` (4.57
    ignores rope_parameters and takes its config class's default rope, silently), ``num_local_experts`` ->
    ``num_experts`` (Qwen3-MoE; 4.57's default is 128); inside ``text_config`` too (Llama 4). {} for a config.json
    in the released names. NxDI sets these after loading config.json (``InferenceConfig(**kwargs)``), so the traced
    model and the neuron_config.json it saves carry them.

    Example::

        transformers4_overrides({"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}})
        # {"rope_theta": 1000000.0, "rope_scaling": None}
    """
    out = _released_names(hf_config)
    text = hf_config.get("text_config")
    if isinstance(text, dict) and _released_names(text):
        out["text_config"] = {**text, **_released_names(text)}
    return out


def _released_names(section: dict) -> dict:
    out: dict = {}
    params = section.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" not in section and "rope_theta" in params:
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        out.update(rope_theta=params["rope_theta"], rope_scaling=None if scaling == {"rope_type": "default"} else
                   scaling)
    if section.get("model_type") == "qwen3_moe" and "num_experts" not in section and "num_local_experts" in section:
        out["num_experts"] = section["num_local_experts"]
    return out


def family_report() -> dict:
    """What `neuronpack doctor` shows of the table: each family NxDI builds (architecture -> family name and NxDI
    class) and each architecture refused, with why."""
    return {"built": {arch: {"family": f.name, "model_class": f.model_class.rsplit(".", 1)[1]}
                      for arch, f in FAMILIES.items()},
            "refused": {arch: r.what.split(":")[0] + (" (judged by a CPU run when NxDI imports)" if r.judged else "")
                        for arch, r in REFUSED.items()}}
