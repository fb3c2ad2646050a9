"""Serving target vllm-neuron: vllm-project/vllm-neuron, the V1 "classic" plugin running NxD Inference models
(0.4.x with vLLM 0.13, 0.5.x with vLLM 0.16).

What its platform, model loader and runner need (vllm_neuron/platform.py, worker/neuronx_distributed_model_loader.py,
worker/neuronx_distributed_model_runner.py):

- still ``NEURON_COMPILED_ARTIFACTS`` (same load, same compile-in-place fallback);
- no ``--override-neuron-config``: ``--additional-config {"override_neuron_config": {...}, "max_prompt_length": N}``.
  The override is ignored when a precompiled artifact loads (its own neuron_config.json wins) but still builds the
  default config first; max_prompt_length must equal the artifact's max_context_length or start-up raises;
- prefix caching is on by default in V1: a contiguous-KV artifact needs ``--no-enable-prefix-caching`` (the plugin
  then sets block_size = max_model_len) and ``--num-gpu-blocks-override`` = max_num_seqs (one block per sequence);
- EAGLE: ``--speculative-config {"method": "eagle", "model", "num_speculative_tokens", "max_model_len"}`` (the
  draft's config.json is read even for a precompiled artifact: the artifact bundles it under draft/);
- LoRA: ``--enable-lora --max-loras --max-lora-rank --lora-modules`` and target_modules inside
  override_neuron_config (the runner pops from that dict, so it must exist); adapters load at start-up only;
- one node only (world size 1, uni executor): multi-node is refused.

Example::

    plugin_command(spec, host="127.0.0.1", port=8000, api_key=None, python="python").argv[-2:]
    # ["--additional-config", '{"max_prompt_length": 2048, "override_neuron_config": {...}}']
"""

from __future__ import annotations

import json

from neuronpack.backends.vllm.launch import LaunchSpec, VllmCommand, base_env, lora_args, server_args
from neuronpack.errors import ServeError


def plugin_command(spec: LaunchSpec, *, host: str, port: int, api_key: str | None, python: str) -> VllmCommand:
    if spec.framework != "nxd":
        raise ServeError("the vllm-neuron plugin serves NxD Inference artifacts only", where="--vllm-target",
                         fix="serve a tnx artifact with --vllm-target vllm-v0")
    if spec.nodes > 1:
        raise ServeError(f"a {spec.nodes}-node artifact cannot be served by the vllm-neuron plugin (V1 runs one node, "
                         "world size 1)", where="--vllm-target",
                         fix="use --vllm-target vllm-v0-fork (the AWS fork's multi-node launcher)")
    argv = server_args(spec, host=host, port=port, api_key=api_key, python=python)
    argv += ["--dtype", spec.dtype, "--tensor-parallel-size", str(spec.tensor_parallel_size),
             "--max-num-seqs", str(spec.max_num_seqs), "--max-model-len", str(spec.max_model_len),
             "--no-enable-prefix-caching", "--num-gpu-blocks-override", str(spec.max_num_seqs)]
    override = dict(spec.override)
    if spec.speculation_length:
        config = {"model": spec.draft, "num_speculative_tokens": spec.speculation_length,
                  "max_model_len": spec.max_model_len}
        if spec.eagle:
            config["method"] = "eagle"
        argv += ["--speculative-config", json.dumps(config, sort_keys=True)]
    if spec.lora is not None:
        argv += lora_args(spec.lora)
        override["target_modules"] = list(spec.lora.target_modules)
    additional = {"max_prompt_length": spec.max_context_length, "override_neuron_config": override}
    if "text_neuron_config" in override:  # an image-to-text artifact (Llama 4): see _image_to_text
        additional = _image_to_text(spec, override)
    argv += ["--additional-config", json.dumps(additional, sort_keys=True)]
    notes = [*spec.notes, "vllm-neuron ignores override_neuron_config when the precompiled artifact loads (its "
                          "neuron_config.json wins); the override only matters if vLLM falls back to compiling"]
    return VllmCommand(argv, base_env(spec), cwd=str(spec.artifact_dir), notes=notes, target="vllm-neuron")


def _image_to_text(spec: LaunchSpec, override: dict) -> dict:
    """The additional config of an image-to-text artifact: no max_prompt_length. With one, the plugin's generic
    validation adds max_context_length to the override, which its image-to-text validation then refuses (only
    text_neuron_config / vision_neuron_config: neuronx_distributed_model_loader.py:1282 and :1290 in 0.5.0), so the
    artifact's prompt limit must be its whole length: vLLM enforces max_model_len only."""
    if spec.max_context_length != spec.max_model_len:
        raise ServeError(
            f"vllm-neuron cannot take max_prompt_length for an image-to-text model, and this artifact's prompts stop "
            f"at {spec.max_context_length} of {spec.max_model_len} tokens (vLLM would let longer prompts through)",
            where="--vllm-target vllm-neuron", fix="rebuild with target.max_context_length = target.seq_len")
    return {"override_neuron_config": override}
