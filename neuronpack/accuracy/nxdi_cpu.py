"""Run an nxd artifact's recorded NeuronConfig and checkpoint through NxD Inference's own model code on the CPU (tp 1).

Where ``neuronx_distributed_inference`` imports (a Neuron build box: no device needed), ``load_on_cpu`` follows
upstream's ``to_cpu()`` step by step (NXD_CPU_MODE, a one-rank gloo group, model-parallel set-up without
collectives, NxDI's own checkpoint loader and NxD's ``get_sharded_checkpoint``), with one change quantized
checkpoints need: the model is built by ``DecoderModelInstance.load_module()``, NxDI's device path, so NxD's
quantization ``convert()`` makes quantized layers (``to_cpu()`` alone loads int8 values as floats and drops every
``.scale`` with a warning). ``load_state_dict(strict=False)``'s missing weights are refused (``AccuracyError`` naming
them); the KV cache (``kv_mgr.*``) is the model's own. ``prefix_logits`` scores tokens teacher-forced through context
encoding, one pass per prefix (on CPU NxDI's token generation returns the updated KV cache functionally and nothing
writes it back). The model class is the artifact's (``compile_config.model_class``; NxDI's Llama by default).
``load_fused_spec_on_cpu`` builds NxDI's fused-speculation model (target + EAGLE draft) the same way and checks
that every weight loads with its shape; upstream has no CPU speculation forward, so nothing of it runs.
``upstream_limit`` names what NxDI's CPU path cannot score (Mllama, LoRA), measured on NxDI 0.9.0.

Every recorded option is kept except what a CPU run at tp 1 and batch 1 must change (``CPU_OVERRIDES``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neuronpack.backends.neuron.common import import_class
from neuronpack.errors import AccuracyError

CPU_OVERRIDES: dict[str, Any] = {
    "tp_degree": 1, "batch_size": 1, "ctx_batch_size": 1, "tkg_batch_size": 1, "on_cpu": True,
    "enable_bucketing": False, "is_continuous_batching": False, "sequence_parallel_enabled": False,
    "save_sharded_checkpoint": False, "on_device_sampling_config": None,
}
DROPPED = ("context_encoding_buckets", "token_generation_buckets")
# Fused speculation has no CPU forward upstream ("Speculation is not yet supported for CPU inference."): the target
# model is checked alone.
SPECULATION_KEYS = ("speculation_length", "enable_fused_speculation", "enable_eagle_speculation", "is_eagle3",
                    "enable_eagle_draft_input_norm")
REBUILD = "rebuild the checkpoint with neuronpack (compile --force, or quantize again)"
RECONVERT = "convert the draft for this target with `neuronpack convert-eagle` (compile does it for a raw draft)"
LLAMA = "neuronx_distributed_inference.models.llama.modeling_llama.NeuronLlamaForCausalLM"
MODULES = ("neuronx_distributed.parallel_layers.parallel_state", "neuronx_distributed.trace.trace",
           "neuronx_distributed_inference.models.llama.modeling_llama",
           "neuronx_distributed_inference.models.model_wrapper", "neuronx_distributed_inference.utils.hf_adapter")


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


def upstream_limit(recorded: dict[str, Any], model_class: str | None) -> str | None:
    """Why NxDI's CPU path cannot score this config (measured on NxDI 0.9.0), or None when it can."""
    if model_class and ".mllama." in model_class:
        return ("the multimodal (Mllama) model is not scored on the CPU: the check feeds text only, and NxDI's "
                "Mllama needs torchvision at import")
    if recorded.get("lora_config"):
        return ("NxDI's CPU forward with LoRA fails in upstream's own code (NxDI 0.9.0 "
                "_copy_past_key_values: IndexError); the adapters' loading is checked by neuronpack's upstream tests")
    return None


def cpu_neuron_config(recorded: dict[str, Any], seq_len: int, dtype: str, *, fused: bool = False) -> dict[str, Any]:
    """The recorded NeuronConfig kwargs as a tp-1, batch-1 CPU run of the target model needs them; ``fused``: of the
    fused-speculation model (the speculation keys stay, and the on-device sampling config, which the draft's sampler
    is built from)."""
    kwargs = {k: v for k, v in recorded.items() if k not in DROPPED and (fused or k not in SPECULATION_KEYS)}
    kwargs.update(CPU_OVERRIDES, seq_len=seq_len, max_context_length=seq_len, torch_dtype=dtype)
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


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_on_cpu(model_dir: str, recorded: dict[str, Any], *, dtype: str, seq_len: int,
                model_class: str | None = None):
    """NxDI's ``model_class`` (the artifact's; None: ``NeuronLlamaForCausalLM``) for ``model_dir`` with the recorded
    NeuronConfig, its weights loaded on the CPU. Returns (app, module); AccuracyError when a weight NxDI expects is
    missing from the checkpoint."""
    from neuronx_distributed_inference.models.model_wrapper import DecoderModelInstance
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    cls = import_class(model_class or LLAMA)

    neuron_config = cls.get_neuron_config_cls()(**cpu_neuron_config(recorded, seq_len, dtype))
    config = cls.get_config_cls()(neuron_config, load_config=load_pretrained_config(model_dir))
    app = cls(model_dir, config)
    instance = DecoderModelInstance(app.models[0].model_cls, app.models[0].config)
    instance.load_module()
    module = instance.module
    where = recorded.get("quantized_checkpoints_path") if recorded.get("quantized") else model_dir
    _load_weights(app, module, "the checkpoint", str(where), REBUILD)
    for wrapper in app.models:
        wrapper.model = module
    app.eval()
    return app, module


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
        loaded = _load_weights(app, module, "the target + draft checkpoints", draft_dir, RECONVERT,
                               extra_buffers=("hidden_state_rolling_buffer",))
    finally:  # NxDI's fused loader sets the class's key prefix ("target_model") and leaves it: a later load breaks
        if not had_prefix and "_FUSED_PREFIX" in vars(cls):
            del cls._FUSED_PREFIX
    return {prefix: sum(k.startswith(prefix + ".") for k in loaded) for prefix in ("draft_model", "target_model")}


def _load_weights(app, module, what: str, where: str, fix: str, extra_buffers: Sequence[str] = ()) -> set[str]:
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
    missing = [k for k in result.missing_keys if k not in buffers and "kv_mgr." not in k
               and not any(b in k for b in extra_buffers)]
    if missing:
        raise AccuracyError(f"NxD Inference found no weight for {', '.join(missing[:5])}"
                            f"{' ...' if len(missing) > 5 else ''} in the checkpoint", where=where, fix=fix)
    return set(state) - set(result.unexpected_keys)


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


def dequantized_reference(reference, quantized_dir: str):
    """A copy of the float32 transformers ``reference`` holding the quantized checkpoint's weights dequantized
    (stored int8 / fp8 values x their float32 scale): what a correct quantized load must reproduce exactly. A head
    the quantizer untied (``--include-lm-head`` on a tied model) is untied in the copy too."""
    import copy

    from neuronpack.accuracy.reference import dequantize_into

    return dequantize_into(copy.deepcopy(reference), quantized_dir)
