"""Run a checkpoint through upstream NxD Inference's own Llama on a CPU, teacher-forced (a worker process).

Usage: ``python nxdi_cpu.py SPEC.json OUT.pt`` in an environment with NxDI's transformers (4.57), the upstream sources
given in the spec on sys.path, and the closed packages served by ``closed_shim``. The spec holds ``model_dir``, the
NeuronConfig kwargs neuronpack recorded (``neuron_config``), ``dtype`` and ``tokens`` (prompt + continuation). Every
recorded option is kept except what a CPU run at tp 1 and batch 1 must change (``CPU_OVERRIDES``): the same model
class, quantization, modules_to_not_convert and dtype as on the device.

Upstream's ``to_cpu()`` is followed step by step (NXD_CPU_MODE, a one-rank gloo group, model parallel init without
collectives, the model's own checkpoint loader and NxD's ``get_sharded_checkpoint``), with one change it needs for
quantized checkpoints: each model is built by ``DecoderModelInstance.load_module()``, NxDI's device path, so NxD's
quantization ``convert()`` turns linears into quantized layers (``to_cpu()`` alone loads int8 values as floats and
drops every ``.scale``). ``load_state_dict(strict=False)``'s missing keys are returned, so the caller can fail on any
that is not a buffer.

Writes a dict to OUT.pt: ``logits`` [len(tokens) - prompt_len + 1, vocab] float32 (row j: the prediction after
prompt + j continuation tokens), ``missing`` / ``unexpected`` keys, ``closed_calls``, ``modules`` (class name counts).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

CPU_OVERRIDES = {"tp_degree": 1, "batch_size": 1, "ctx_batch_size": 1, "tkg_batch_size": 1, "on_cpu": True,
                 "enable_bucketing": False, "is_continuous_batching": False, "sequence_parallel_enabled": False,
                 "save_sharded_checkpoint": False, "on_device_sampling_config": None}
DROPPED = ("context_encoding_buckets", "token_generation_buckets")


def cpu_neuron_config(recorded: dict, seq_len: int, dtype: str) -> dict:
    """The recorded NeuronConfig kwargs as a tp-1, batch-1 CPU run needs them."""
    kwargs = {k: v for k, v in recorded.items() if k not in DROPPED}
    kwargs.update(CPU_OVERRIDES, seq_len=seq_len, max_context_length=seq_len, torch_dtype=dtype)
    return kwargs


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    sys.path[:0] = [str(Path(__file__).parent), *spec["sys_path"]]
    import closed_shim

    closed_shim.install()
    import torch
    from neuronx_distributed.parallel_layers.parallel_state import initialize_model_parallel
    from neuronx_distributed.trace.trace import get_sharded_checkpoint
    from neuronx_distributed_inference.models.llama.modeling_llama import NeuronLlamaForCausalLM
    from neuronx_distributed_inference.models.model_wrapper import DecoderModelInstance
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    os.environ["NXD_CPU_MODE"] = "1"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(spec.get("port", 29500)))
    torch.distributed.init_process_group(backend="gloo", world_size=1, rank=0)
    initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                              expert_model_parallel_size=1, skip_collective_init=True)
    # Sealed here, not after the imports: model-parallel set-up builds NxD's context-parallel CollectivesConfig (a
    # closed config object, unused at cp 1). From here on, loading and every forward must run open code only.
    closed_shim.seal()
    results = {}
    for name, run in spec["runs"].items():
        del closed_shim.CALLS[:]
        try:
            results[name] = _run(run, NeuronLlamaForCausalLM, DecoderModelInstance, load_pretrained_config,
                                 get_sharded_checkpoint)
        except Exception as exc:  # NxDI refused the config or checkpoint: the caller decides whether it should
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        results[name]["closed_calls"] = list(closed_shim.CALLS)
    torch.save(results, out_path)


def _run(run: dict, cls, instance_cls, load_pretrained_config, get_sharded_checkpoint) -> dict:
    import torch

    tokens, prompt_len = run["tokens"], run["prompt_len"]
    neuron_config = cls.get_neuron_config_cls()(**cpu_neuron_config(run["neuron_config"], len(tokens) + 1,
                                                                     run["dtype"]))
    config = cls.get_config_cls()(neuron_config, load_config=load_pretrained_config(run["model_dir"]))
    app = cls(run["model_dir"], config)
    instance = instance_cls(app.models[0].model_cls, app.models[0].config)
    instance.load_module()
    module = instance.module
    state = app.checkpoint_loader_fn()
    get_sharded_checkpoint(state, module, 0, 1)
    result = module.load_state_dict(state, strict=False)
    for wrapper in app.models:
        wrapper.model = module
    app.eval()
    rows = []
    with torch.inference_mode():
        # Teacher-forced through context encoding: one pass per prefix, the last position's logits. (Token
        # generation on CPU returns the updated KV cache functionally; on a device aliasing writes it back, so a
        # CPU token-generation loop would read a stale cache: upstream's runtime, not the checkpoint, decides that.)
        for end in range(prompt_len, len(tokens) + 1):
            ids = torch.tensor([tokens[:end]])
            out = app(ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(end)[None],
                      seq_ids=torch.tensor([0]))
            rows.append(out.logits[0, -1].float())
    # The KV cache (kv_mgr.*) is made by the model, never read from a checkpoint; every other missing key is a weight
    buffers = {name for name, _ in module.named_buffers()}
    missing = [k for k in result.missing_keys if k not in buffers and not k.startswith("kv_mgr.")]
    return {"logits": torch.stack(rows), "missing_params": missing, "unexpected": list(result.unexpected_keys),
            "modules": dict(Counter(type(m).__name__ for m in module.modules()))}


if __name__ == "__main__":
    main(*sys.argv[1:3])
