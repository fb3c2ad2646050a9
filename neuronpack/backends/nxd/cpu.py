"""NxD Inference's own model classes on the CPU at tp 1: what the accuracy check (accuracy/nxdi_cpu.py) and the family
judge (defects.py) run, where ``neuronx_distributed_inference`` imports (a Neuron build box: no device needed).

``load_on_cpu`` follows upstream's ``to_cpu()`` step by step (NXD_CPU_MODE, a one-rank gloo group, model-parallel
set-up without collectives, NxDI's own checkpoint loader and NxD's ``get_sharded_checkpoint``), with one change
quantized checkpoints need: the model is built by ``DecoderModelInstance.load_module()``, NxDI's device path, so NxD's
quantization ``convert()`` makes quantized layers (``to_cpu()`` alone loads int8 values as floats and drops every
``.scale`` with a warning). ``load_state_dict(strict=False)``'s missing weights are refused (``AccuracyError`` naming
them); the KV cache (``kv_mgr.*``) is the model's own, and a tensor NxDI registers under two names (gpt-oss and
Llama 4: ``feed_forward.moe.rmsnorm`` is ``post_attention_layernorm``) is loaded when one of its names is.
An image-to-text family (Llama 4) runs its text decoder: NxDI's text class built on the checkpoint's ``text_config``,
as its image-to-text class builds its text model. A transformers 5 config.json's renamed keys reach NxDI in the
names its transformers 4.57 reads, as in the build (families.transformers4_overrides). ``prefix_logits`` scores
tokens teacher-forced through context encoding, one pass per prefix (on CPU NxDI's token generation returns the
updated KV cache functionally and nothing writes it back).

Every recorded option is kept except what a CPU run at tp 1 and batch 1 must change (``CPU_OVERRIDES``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from neuronpack.backends.neuron.common import import_class, read_model_config
from neuronpack.backends.nxd.families import FAMILIES, transformers4_overrides
from neuronpack.errors import AccuracyError

CPU_OVERRIDES: dict[str, Any] = {
    "tp_degree": 1, "batch_size": 1, "ctx_batch_size": 1, "tkg_batch_size": 1, "on_cpu": True,
    "enable_bucketing": False, "is_continuous_batching": False, "sequence_parallel_enabled": False,
    "save_sharded_checkpoint": False, "on_device_sampling_config": None, "moe_tp_degree": 1, "moe_ep_degree": 1,
}
DROPPED = ("context_encoding_buckets", "token_generation_buckets")
# Fused speculation has no CPU forward upstream ("Speculation is not yet supported for CPU inference."): the target
# model is checked alone.
SPECULATION_KEYS = ("speculation_length", "enable_fused_speculation", "enable_eagle_speculation", "is_eagle3",
                    "enable_eagle_draft_input_norm")
REBUILD = "rebuild the checkpoint with neuronpack (compile --force, or quantize again)"
LLAMA = FAMILIES["LlamaForCausalLM"].model_class
MODULES = ("neuronx_distributed.parallel_layers.parallel_state", "neuronx_distributed.trace.trace",
           "neuronx_distributed_inference.models.llama.modeling_llama",
           "neuronx_distributed_inference.models.model_wrapper", "neuronx_distributed_inference.utils.hf_adapter")
# NxDI's layer-boundary markers: XLA custom calls wrapped round every Qwen3-MoE decoder layer
# (models/layer_boundary_marker.py:18, models/qwen3_moe/modeling_qwen3_moe.py:410)
MARKERS = "neuronx_distributed_inference.models.layer_boundary_marker"


def nxdi_importable() -> bool:
    """True where every NxD Inference / NxD module the CPU run uses imports (the real SDK on a Neuron build box, or
    upstream sources with the closed packages served); imports them."""
    import importlib

    try:
        for name in MODULES:
            importlib.import_module(name)
    except Exception:
        return False
    return True


def import_family_modules() -> list[str]:
    """Import every family's NxDI modules that import here (some run closed code at import: Qwen3-MoE's ``nki_jit()``);
    the class paths that did."""
    imported = []
    for path in sorted({cls for f in FAMILIES.values() for cls in (f.model_class, f.text_class) if cls}):
        try:
            import_class(path)
        except Exception:  # noqa: BLE001 - a family whose module needs more than this machine has (Mllama)
            continue
        imported.append(path)
    return imported


def markers_run_on_cpu() -> bool:
    """Whether NxDI's layer-boundary markers run on a CPU tensor (they are XLA custom calls: upstream's do not)."""
    import importlib

    import torch

    try:
        markers = importlib.import_module(MARKERS)
        markers.ModuleMarkerEndWrapper()(markers.ModuleMarkerStartWrapper()(torch.zeros(1)))
    except Exception:  # noqa: BLE001 - whatever the custom call raises off the device
        return False
    return True


def cpu_neuron_config(recorded: dict[str, Any], seq_len: int, dtype: str, *, fused: bool = False) -> dict[str, Any]:
    """The recorded NeuronConfig kwargs as a tp-1, batch-1 CPU run of the target model needs them; ``fused``: of the
    fused-speculation model (the speculation keys stay, and the on-device sampling config, which the draft's sampler
    is built from). MoE degrees are set only where the recipe had them (a MoENeuronConfig)."""
    kwargs = {k: v for k, v in recorded.items() if k not in DROPPED and (fused or k not in SPECULATION_KEYS)}
    kwargs.update({k: v for k, v in CPU_OVERRIDES.items() if not k.startswith("moe_") or k in recorded},
                  seq_len=seq_len, max_context_length=seq_len, torch_dtype=dtype)
    if fused:
        kwargs["on_device_sampling_config"] = recorded.get("on_device_sampling_config")
    return kwargs


def init_cpu_process_group(port: int | None = None) -> None:
    """The one-rank gloo group and model-parallel state upstream's ``to_cpu()`` sets up (once per process)."""
    import torch
    from neuronx_distributed.parallel_layers.parallel_state import initialize_model_parallel

    os.environ["NXD_CPU_MODE"] = "1"
    if torch.distributed.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port or _free_port()))  # not 29500: two checks may run at once
    torch.distributed.init_process_group(backend="gloo", world_size=1, rank=0)
    initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                              expert_model_parallel_size=1, skip_collective_init=True)


def load_on_cpu(model_dir: str, recorded: dict[str, Any], *, dtype: str, seq_len: int,
                model_class: str | None = None):
    """NxDI's ``model_class`` (the artifact's; None: ``NeuronLlamaForCausalLM``) for ``model_dir`` with the recorded
    NeuronConfig, its weights loaded on the CPU. Returns (app, module); AccuracyError when a weight NxDI expects is
    missing from the checkpoint."""
    from neuronx_distributed_inference.models.model_wrapper import DecoderModelInstance
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    cls, text = _cpu_class(model_class or LLAMA)
    neuron_config = cls.get_neuron_config_cls()(**cpu_neuron_config(recorded, seq_len, dtype))
    config = cls.get_config_cls()(neuron_config, load_config=load_pretrained_config(model_dir),
                                  **transformers4_overrides(read_model_config(model_dir)))
    app = cls(model_dir, config.text_config if text else config)
    instance = DecoderModelInstance(app.models[0].model_cls, app.models[0].config)
    instance.load_module()
    module = instance.module
    where = recorded.get("quantized_checkpoints_path") if recorded.get("quantized") else model_dir
    load_weights(app, module, "the checkpoint", str(where), REBUILD)
    for wrapper in app.models:
        wrapper.model = module
    app.eval()
    return app, module


def load_weights(app, module, what: str, where: str, fix: str, extra_buffers: Sequence[str] = ()) -> set[str]:
    """``app``'s checkpoint through NxDI's own loader and NxD's ``get_sharded_checkpoint`` into ``module`` (tp 1);
    the names loaded. AccuracyError when NxDI refuses a tensor, or when ``load_state_dict(strict=False)`` found no
    value for a weight (buffers aside: the KV cache, ``extra_buffers``)."""
    from neuronx_distributed.trace.trace import get_sharded_checkpoint

    try:
        state = app.checkpoint_loader_fn()
        get_sharded_checkpoint(state, module, 0, 1)
        result = module.load_state_dict(state, strict=False)
    except (RuntimeError, AssertionError, ValueError, KeyError) as exc:  # NxDI's own checks of the checkpoint
        raise AccuracyError(f"NxD Inference refused {what}: {exc}", where=where, fix=fix) from exc
    buffers = {name for name, _ in module.named_buffers()}
    loaded = set(state) - set(result.unexpected_keys)
    shared = _shared_names(module)
    missing = [k for k in result.missing_keys if k not in buffers and "kv_mgr." not in k
               and not any(b in k for b in extra_buffers) and not shared.get(k, set()) & loaded]
    if missing:
        raise AccuracyError(f"NxD Inference found no weight for {', '.join(missing[:5])}"
                            f"{' ...' if len(missing) > 5 else ''} in the checkpoint", where=where, fix=fix)
    return loaded


def prefix_logits(app, tokens: Sequence[int], prompt_len: int):
    """float32 logits [len(tokens) - prompt_len + 1, vocab]: row j predicts the token after prompt + j more."""
    import torch

    rows = []
    with torch.inference_mode():
        for end in range(prompt_len, len(tokens) + 1):
            ids = torch.tensor([list(tokens[:end])])
            out = app(ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(end)[None],
                      seq_ids=torch.tensor([0]))
            rows.append(out.logits[0, -1].float())
    return torch.stack(rows)


# --- private ---------------------------------------------------------------------------------------------------------
def _cpu_class(model_class: str):
    """(the class to run, whether it runs on the config's text_config): an image-to-text family's text class."""
    family = next((f for f in FAMILIES.values() if f.model_class == model_class and f.text_class), None)
    return (import_class(family.text_class), True) if family else (import_class(model_class), False)


def _shared_names(module) -> dict[str, set[str]]:
    """{parameter name: the other names of the same tensor}: NxDI registers some modules twice (gpt-oss and Llama 4:
    ``feed_forward.moe.rmsnorm`` is ``post_attention_layernorm``), and a state dict gives one of the names."""
    by_tensor: dict[int, set[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(param), set()).add(name)
    return {name: names - {name} for names in by_tensor.values() for name in names if len(names) > 1}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
