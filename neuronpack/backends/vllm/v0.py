"""Serving target vLLM V0 with its Neuron worker: mainline 0.9.x (dialect "0.9") and the AWS Neuron fork
aws-neuron/upstreaming-to-vllm 2.24.0 (vLLM 0.7.2 base, dialect "fork").

What their argument parsers and loaders need (vllm/engine/arg_utils.py, vllm/platforms/neuron.py,
vllm/model_executor/model_loader/neuronx_distributed.py):

- no ``--block-size``: its choices stop at 128 and the Neuron path sets block_size = max_model_len itself;
- ``--device neuron``: the fork decides the contiguous KV layout (block_size = max_model_len) only when device is
  literally "neuron" (mainline parses it, deprecated);
- ``--override-neuron-config``: setattr'd onto the loaded neuron_config.json;
- speculation: 0.9 ``--speculative-config {"model", "num_speculative_tokens", "max_model_len"}``; the fork has no
  such flag: ``--speculative-model DRAFT --num-speculative-tokens K``;
- LoRA: ``--enable-lora --max-loras --max-lora-rank --lora-modules name=path`` (vLLM puts them into the override as
  lora_modules itself) and ``target_modules`` in the override;
- multi-node (fork only, NxDI): the released launcher examples/neuron/multi_node/multi_node_launcher.sh (mpirun)
  running launch_script.py, which sets ENABLE_NEURON_MULTI_NODE=true, NEURON_RT_ROOT_COMM_ID=<master>:63423 and the
  override {world_size, tp_degree, local_ranks_size, start_rank_id} per rank. Mainline vLLM has no multi-node code.

Example::

    v0_command(spec, dialect="0.9", host="127.0.0.1", port=8000, api_key=None, python="python").argv[:3]
    # ["python", "-m", "vllm.entrypoints.openai.api_server"]
"""

from __future__ import annotations

import json

from neuronpack.backends.vllm.launch import LaunchSpec, VllmCommand, base_env, lora_args, server_args
from neuronpack.errors import ServeError

FORK_EXAMPLES = "${VLLM_SRC}/examples/neuron/multi_node"  # a checkout of aws-neuron/upstreaming-to-vllm @ 2.24.0
# What each V0 Neuron loader builds an NxDI model for (_NEURON_SUPPORTED_MODELS in
# vllm/model_executor/model_loader/neuronx_distributed.py of vLLM 0.9.2 and of the fork at 2.24.0)
V0_ARCHITECTURES = {
    "0.9": ("LlamaForCausalLM", "MistralForCausalLM", "DbrxForCausalLM", "MixtralForCausalLM",
            "MllamaForConditionalGeneration"),
    "fork": ("LlamaForCausalLM", "MistralForCausalLM", "DbrxForCausalLM", "MixtralForCausalLM",
             "MllamaForConditionalGeneration", "Qwen2ForCausalLM"),
}
MULTI_NODE_NOTE = ("multi-node: run on the head node with VLLM_SRC = a checkout of aws-neuron/upstreaming-to-vllm "
                   "2.24.0, MASTER_ADDR / MASTER_PORT and a hostfile; the launcher runs mpirun -np 2 (edit it for "
                   "more nodes) and starts vllm.entrypoints.api_server (not the OpenAI server) on rank 0")


def v0_command(spec: LaunchSpec, *, dialect: str, host: str, port: int, api_key: str | None,
               python: str) -> VllmCommand:
    target = "vllm-v0-fork" if dialect == "fork" else "vllm-v0"
    known = V0_ARCHITECTURES[dialect]
    if spec.framework == "nxd" and spec.architecture and spec.architecture not in known:
        raise ServeError(f"{'the AWS fork 2.24.0' if dialect == 'fork' else 'vLLM 0.9'}'s Neuron loader has no model "
                         f"class for {spec.architecture} (it knows {', '.join(known)})", where="--vllm-target",
                         fix="serve it with --vllm-target vllm-neuron (the plugin maps every NxD Inference model "
                             "type)")
    if spec.nodes > 1:
        if dialect != "fork" or spec.framework != "nxd":
            raise ServeError(
                f"a {spec.nodes}-node artifact needs the AWS Neuron fork's multi-node launcher; vLLM mainline has "
                "no multi-node Neuron code", where="--vllm-target",
                fix="use --vllm-target vllm-v0-fork with aws-neuron/upstreaming-to-vllm 2.24.0")
        return _multi_node(spec, port=port, python=python)
    argv = server_args(spec, host=host, port=port, api_key=api_key, python=python)
    argv += ["--device", "neuron", "--dtype", spec.dtype, "--tensor-parallel-size", str(spec.tensor_parallel_size),
             "--max-num-seqs", str(spec.max_num_seqs), "--max-model-len", str(spec.max_model_len)]
    if spec.tnx_quantized:
        argv += ["--quantization", "neuron_quant"]
    if spec.speculation_length:
        argv += _speculation(spec, dialect)
    override = dict(spec.override)
    if spec.lora is not None:
        argv += lora_args(spec.lora)
        override["target_modules"] = list(spec.lora.target_modules)
    if override:
        argv += ["--override-neuron-config", json.dumps(override, sort_keys=True)]
    return VllmCommand(argv, base_env(spec), cwd=str(spec.artifact_dir), notes=list(spec.notes), target=target)


def _speculation(spec: LaunchSpec, dialect: str) -> list[str]:
    if dialect == "fork":
        return ["--speculative-model", str(spec.draft), "--num-speculative-tokens", str(spec.speculation_length)]
    config = {"model": spec.draft, "num_speculative_tokens": spec.speculation_length,
              "max_model_len": spec.max_model_len}
    return ["--speculative-config", json.dumps(config, sort_keys=True)]


def _multi_node(spec: LaunchSpec, *, port: int, python: str) -> VllmCommand:
    local = spec.tensor_parallel_size // spec.nodes
    argv = ["bash", f"{FORK_EXAMPLES}/multi_node_launcher.sh", "-h", "${HOSTFILE}", "-a", "${MASTER_ADDR}",
            "-p", "${MASTER_PORT}", python, f"{FORK_EXAMPLES}/launch_script.py",
            "--model", spec.model, "--world-size", str(spec.tensor_parallel_size),
            "--max-num-seqs", str(spec.max_num_seqs), "--max-model-len", str(spec.max_model_len),
            "--max-context-length", str(spec.max_context_length), "--compiled-model-path", str(spec.artifact_dir),
            "--local-ranks-size", str(local), "--port", str(port)]
    return VllmCommand(argv, {}, cwd=str(spec.artifact_dir), notes=[*spec.notes, MULTI_NODE_NOTE],
                       target="vllm-v0-fork", launched_elsewhere=True)
