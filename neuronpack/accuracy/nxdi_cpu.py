"""Run an nxd artifact's recorded NeuronConfig and checkpoint through NxD Inference's own model code on the CPU (tp 1).

The loading is NxDI's own, step by step as upstream's ``to_cpu()`` (backends/nxd/cpu.py, shared with the family
judge): ``load_on_cpu`` builds the artifact's class (``compile_config.model_class``; NxDI's Llama by default; Llama 4:
its text decoder) and refuses missing weights, ``prefix_logits`` scores tokens teacher-forced through context
encoding. Here: ``load_fused_spec_on_cpu`` builds NxDI's fused-speculation model (target + EAGLE draft) the same way
and checks that every weight loads with its shape (upstream has no CPU speculation forward, so nothing of it runs);
``upstream_limit`` names what NxDI's CPU path cannot score (Mllama, LoRA, Qwen3-MoE's layer-boundary markers),
measured on NxDI 0.9.0; ``dequantized_reference`` is what a correct quantized load must reproduce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neuronpack.backends.neuron.common import import_class
from neuronpack.backends.nxd.cpu import (  # noqa: F401 - the CPU run's API, as accuracy/check.py and tests use it
    CPU_OVERRIDES,
    LLAMA,
    REBUILD,
    cpu_neuron_config,
    import_family_modules,
    init_cpu_process_group,
    load_on_cpu,
    load_weights,
    markers_run_on_cpu,
    nxdi_importable,
    prefix_logits,
)
from neuronpack.backends.nxd.families import FAMILIES

RECONVERT = "convert the draft for this target with `neuronpack convert-eagle` (compile does it for a raw draft)"
QWEN3_MOE = FAMILIES["Qwen3MoeForCausalLM"].model_class


def upstream_limit(recorded: dict[str, Any], model_class: str | None) -> str | None:
    """Why NxDI's CPU path cannot score this config (measured on NxDI 0.9.0), or None when it can."""
    if model_class and ".mllama." in model_class:
        return ("the multimodal (Mllama) model is not scored on the CPU: the check feeds text only, and NxDI's "
                "Mllama needs torchvision at import")
    if model_class == QWEN3_MOE and not markers_run_on_cpu():
        return ("NxDI's Qwen3-MoE wraps every decoder layer in layer-boundary markers, XLA custom calls that do not "
                "run on the CPU (models/layer_boundary_marker.py:18, models/qwen3_moe/modeling_qwen3_moe.py:410)")
    if recorded.get("lora_config"):
        return ("NxDI's CPU forward with LoRA fails in upstream's own code (NxDI 0.9.0 "
                "_copy_past_key_values: IndexError); the adapters' loading is checked by neuronpack's upstream tests")
    return None


def load_fused_spec_on_cpu(model_dir: str, recorded: dict[str, Any], draft_dir: str, *, dtype: str,
                           seq_len: int, model_class: str | None = None) -> dict[str, int]:
    """NxDI's ``NeuronFusedSpecModel`` (target + EAGLE draft, the config neuronpack records, its own fused-speculation
    config and draft process group) built on the CPU and given the target's and the draft's checkpoints through
    NxDI's fused loader: every ``draft_model.*`` / ``target_model.*`` weight must load with the right shape
    (AccuracyError naming what is missing or mis-shaped). Upstream has no CPU speculation forward, so nothing runs.
    Returns ``{"draft_model": n, "target_model": m}``, the weights loaded."""
    from neuronx_distributed_inference.models.application_base import init_custom_process_group_fn
    from neuronx_distributed_inference.models.model_wrapper import DecoderModelInstance

    from neuronpack.backends.nxd.backend import inference_config

    cls = import_class(model_class or LLAMA)
    config = inference_config(cls, {"neuron_config": cpu_neuron_config(recorded, seq_len, dtype, fused=True),
                                    "draft": {}}, Path(model_dir), Path(draft_dir))
    app = cls(model_dir, config)
    init_custom_process_group_fn(app.config)  # the draft's tensor-parallel group, as NxDI's model builder makes it
    wrapper = app.fused_spec_model
    instance = DecoderModelInstance(wrapper.model_cls, wrapper.config)
    instance.load_module()
    module = instance.module
    had_prefix = "_FUSED_PREFIX" in vars(cls)
    try:
        loaded = load_weights(app, module, "the target + draft checkpoints", draft_dir, RECONVERT,
                              extra_buffers=("hidden_state_rolling_buffer",))
    finally:  # NxDI's fused loader sets the class's key prefix ("target_model") and leaves it: a later load breaks
        if not had_prefix and "_FUSED_PREFIX" in vars(cls):
            del cls._FUSED_PREFIX
    return {prefix: sum(k.startswith(prefix + ".") for k in loaded) for prefix in ("draft_model", "target_model")}


def dequantized_reference(reference, quantized_dir: str):
    """A copy of the float32 transformers ``reference`` holding the quantized checkpoint's weights dequantized
    (stored int8 / fp8 values x their float32 scale): what a correct quantized load must reproduce exactly. A head
    the quantizer untied (``--include-lm-head`` on a tied model) is untied in the copy too. Llama 4's checkpoint
    names (``language_model.*``) are the text model's without that prefix; every dequantized weight must land."""
    import copy

    from neuronpack.accuracy.reference import dequantize_into

    return dequantize_into(copy.deepcopy(reference), quantized_dir)
