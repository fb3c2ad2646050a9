"""The vLLM (0.9, Neuron) command line that loads a neuronpack artifact instead of recompiling.

vLLM reuses precompiled Neuron artifacts only through ``NEURON_COMPILED_ARTIFACTS``, and only if it is started with
the same tensor_parallel_size / max_num_seqs / max_model_len (and overrides) the artifact was compiled with: on a
mismatch or a load error it recompiles into that directory. So the command is derived from the manifest:

- env: NEURON_COMPILED_ARTIFACTS=<artifact>, VLLM_NEURON_FRAMEWORK; for TNx the bucket lists and NEURON_QUANT_DTYPE;
- ``--override-neuron-config``: the scalar/list NeuronConfig fields that differ from vLLM's defaults (nested config
  objects are left out: vLLM sets overrides with setattr on the loaded config, and a plain dict there would replace
  the OnDeviceSamplingConfig object; the artifact's neuron_config.json already holds them);
- speculation: ``--speculative-config {"model", "num_speculative_tokens", "max_model_len"}`` (vLLM 0.9 form);
- LoRA: ``--enable-lora --max-loras --max-lora-rank --lora-modules name=path`` plus ``lora_modules`` /
  ``target_modules`` in the override (what vLLM's Neuron runner reads; adapters load at start-up only);
- multi-node (NxDI only, the AWS Neuron fork of vLLM; vLLM mainline runs tensor parallelism within one node): one
  launch line per node with NEURON_RANK_ID and start_rank_id / local_ranks_size.

Example::

    cmd = vllm_command(artifact, read_manifest(artifact), port=8080)
    print(format_command(cmd))
    # NEURON_COMPILED_ARTIFACTS=/art/abc VLLM_NEURON_FRAMEWORK=neuronx-distributed-inference python -m vllm...
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.backends.select import FRAMEWORK_TO_VLLM
from neuronpack.errors import ArtifactError, ServeError

if TYPE_CHECKING:
    from neuronpack.artifacts.manifest import Manifest, ServeHints

API_SERVER = "vllm.entrypoints.openai.api_server"
MULTI_NODE_RUNNER = "neuron_multi_node_runner.py"  # examples/neuron_multi_nodel/ in aws-neuron/upstreaming-to-vllm
ROOT_COMM_PORT, CPU_COMM_PORT = 8990, 8989
MASTER_ADDR_REF = "${MASTER_ADDR}"
# NeuronConfig fields holding config objects: never passed through --override-neuron-config (see module docstring)
NESTED_FIELDS = ("on_device_sampling_config", "lora_config")


@dataclass(frozen=True)
class VllmCommand:
    argv: list[str]
    env: dict[str, str]  # only the variables neuronpack sets; the rest of the environment is inherited
    per_node: list[VllmCommand] = field(default_factory=list)  # multi-node: one command per node, node 0 first
    notes: list[str] = field(default_factory=list)


def vllm_command(
    artifact_dir: Path,
    manifest: Manifest,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    python: str = sys.executable,
) -> VllmCommand:
    """The vLLM launch for a compiled nxd or tnx artifact (see the module docstring).

    Example::

        vllm_command(Path("art"), manifest).env["NEURON_COMPILED_ARTIFACTS"]   # "/abs/art"
    """
    artifact_dir = Path(artifact_dir).absolute()
    framework = manifest.framework
    if framework not in FRAMEWORK_TO_VLLM:
        raise ArtifactError(
            f"vLLM serves nxd and tnx artifacts; this one was built for {framework!r}", where=str(artifact_dir),
            fix="serve it with `neuronpack serve` (portable runtime) or rebuild with --framework nxd")
    serve = manifest.serve
    config = manifest.compile_config
    env = {"NEURON_COMPILED_ARTIFACTS": str(artifact_dir), "VLLM_NEURON_FRAMEWORK": FRAMEWORK_TO_VLLM[framework]}
    if framework == "nxd":
        model, override, notes = _nxd_side(artifact_dir, manifest, config)
        dtype = str(config["neuron_config"].get("torch_dtype", "auto"))
    else:
        model, override, notes = _tnx_side(artifact_dir, manifest, config, env)
        dtype = {v: k for k, v in _AMP.items()}.get(config["from_pretrained"]["amp"], "auto")
    argv = [python, "-m", API_SERVER, "--model", model, "--host", host, "--port", str(port)]
    if serve.served_model_name:
        argv += ["--served-model-name", serve.served_model_name]
    if api_key:
        argv += ["--api-key", api_key]
    seq_len = int(_required(serve, "max_model_len", artifact_dir))
    argv += ["--device", "neuron", "--dtype", dtype,
             "--tensor-parallel-size", str(_required(serve, "tensor_parallel_size", artifact_dir)),
             "--max-num-seqs", str(_required(serve, "max_num_seqs", artifact_dir)),
             "--max-model-len", str(seq_len), "--block-size", str(seq_len)]  # Neuron: one block per sequence
    if framework == "tnx" and "quant" in config.get("neuron_config", {}):
        argv += ["--quantization", "neuron_quant"]
    argv += _speculation_args(artifact_dir, serve, config, seq_len)
    override.update(_lora_args(serve, manifest, argv))
    cmd = VllmCommand(argv + _override_args(override), env, notes=notes)
    nodes = serve.nodes
    return _with_nodes(cmd, argv, override, nodes, int(serve.tensor_parallel_size)) if nodes > 1 else cmd


def format_command(cmd: VllmCommand) -> str:
    """Shell-quoted, environment first; multi-node commands become one commented line per node.

    Example::

        format_command(VllmCommand(["python", "-m", "x"], {"A": "1 2"}))   # "A='1 2' python -m x"
    """
    if cmd.per_node:
        lines = []
        for rank, node in enumerate(cmd.per_node):
            lines.append(f"# node {rank} of {len(cmd.per_node)} (MASTER_ADDR must be node 0's address)")
            lines.append(format_command(node))
        return "\n".join(lines)
    env = " ".join(f"{k}={_quote_env(v)}" for k, v in cmd.env.items())
    argv = " ".join(shlex.quote(a) for a in cmd.argv)
    return f"{env} {argv}" if env else argv


def run_vllm(cmd: VllmCommand) -> None:
    """Replace this process with vLLM (never returns). ServeError when the module is not importable or the command
    is a multi-node one (those lines are run on each node)."""
    if cmd.per_node:
        raise ServeError("a multi-node artifact is launched on every node, not from here", where="target.nodes",
                         fix="run the lines from `neuronpack serve --print-command` on each node")
    module = _module_of(cmd.argv)
    if module and Path(cmd.argv[0]).resolve() == Path(sys.executable).resolve():
        if importlib.util.find_spec(module.split(".")[0]) is None:
            raise ServeError(f"{module.split('.')[0]} is not installed in this Python", where=sys.executable,
                             fix="install vLLM with Neuron support on the Neuron machine (see docs/neuron.md), "
                                 "or print the command with --print-command")
    os.execvpe(cmd.argv[0], cmd.argv, {**os.environ, **cmd.env})


# --- private ---------------------------------------------------------------------------------------------------------
_AMP = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_ENV_REF = re.compile(r"\$\{[A-Z_][A-Z0-9_]*\}(:\d+)?")


def _required(serve: ServeHints, name: str, artifact_dir: Path):
    if getattr(serve, name) is None:
        raise ArtifactError(f"the manifest has no serve.{name}", where=str(artifact_dir),
                            fix="rebuild the artifact with this neuronpack version")
    return getattr(serve, name)


def _nxd_side(artifact_dir: Path, manifest: Manifest, config: dict) -> tuple[str, dict, list[str]]:
    neuron_config = config.get("neuron_config")
    if not isinstance(neuron_config, dict):
        raise ArtifactError("the manifest has no compile_config.neuron_config", where=str(artifact_dir),
                            fix="rebuild the artifact with this neuronpack version")
    override = neuron_override(neuron_config, speculation=bool(neuron_config.get("speculation_length")))
    if neuron_config.get("save_sharded_checkpoint"):
        # weights/ holds every rank's shard and the artifact has config.json + tokenizer: it is the whole model
        return str(artifact_dir), override, []
    model = manifest.model.path
    return str(model), override, [f"weights are sharded on load from {model}: keep it reachable"]


def _tnx_side(artifact_dir: Path, manifest: Manifest, config: dict, env: dict) -> tuple[str, dict, list[str]]:
    fp = config.get("from_pretrained") or {}
    env["NEURON_CONTEXT_LENGTH_BUCKETS"] = ",".join(str(b) for b in fp.get("context_length_estimate", []))
    env["NEURON_TOKEN_GEN_BUCKETS"] = ",".join(str(b) for b in fp.get("n_positions", []))
    quant = (config.get("neuron_config") or {}).get("quant")
    if quant:
        env["NEURON_QUANT_DTYPE"] = quant["quant_dtype"]
    recipe_overrides = manifest.recipe.neuron_overrides
    model = str(manifest.model.path)
    notes = ["vLLM's transformers-neuronx path compiles at start-up (it does not read NEURON_COMPILED_ARTIFACTS); "
             "the bucket variables make it compile exactly what this artifact holds"]
    return model, dict(recipe_overrides), notes


def neuron_override(neuron_config: dict, *, speculation: bool = False) -> dict:
    """The NeuronConfig fields that differ from what vLLM 0.9 builds from its own flags (tp, max_num_seqs,
    max_model_len, dtype are passed as flags), minus nested config objects.

    Example::

        neuron_override({"seq_len": 4096, "max_context_length": 2048, "save_sharded_checkpoint": True, ...})
        # {"context_encoding_buckets": [...], "max_context_length": 2048, "save_sharded_checkpoint": True, ...}
    """
    n = neuron_config
    defaults: dict[str, Any] = {
        "tp_degree": n.get("tp_degree"), "batch_size": n.get("batch_size"), "ctx_batch_size": 1,
        "tkg_batch_size": n.get("batch_size"),  # NxDI derives it from batch_size
        "max_context_length": n.get("seq_len"), "seq_len": n.get("seq_len"), "enable_bucketing": True,
        "is_continuous_batching": True, "quantized": False, "torch_dtype": n.get("torch_dtype"),
    }
    if speculation:
        defaults.update({"speculation_length": n.get("speculation_length"), "enable_fused_speculation": True})
    else:
        defaults.update({"padding_side": "right", "sequence_parallel_enabled": True})
    return {k: v for k, v in sorted(n.items()) if k not in NESTED_FIELDS and (k not in defaults or defaults[k] != v)}


def _speculation_args(artifact_dir: Path, serve: ServeHints, config: dict, seq_len: int) -> list[str]:
    length = serve.speculation_length
    if not length:
        return []
    bundled = artifact_dir / "draft"
    draft = str(bundled) if (bundled / "config.json").is_file() else serve.draft_path
    if not draft:
        raise ArtifactError("the artifact speculates but records no draft", where=str(artifact_dir),
                            fix="rebuild it with `neuronpack compile --force`")
    spec = {"model": draft, "num_speculative_tokens": length, "max_model_len": seq_len}
    return ["--speculative-config", json.dumps(spec, sort_keys=True)]


def _lora_args(serve: ServeHints, manifest: Manifest, argv: list[str]) -> dict:
    modules = serve.lora_modules
    lora = manifest.recipe.lora
    if not modules or lora is None:
        return {}
    argv += ["--enable-lora", "--max-loras", str(lora.max_loras), "--max-lora-rank", str(lora.max_rank),
             "--lora-modules"]
    argv += [f"{m.name}={m.path}" for m in modules]
    return {"lora_modules": [{"name": m.name, "path": m.path} for m in modules],
            "target_modules": list(lora.target_modules)}


def _override_args(override: dict) -> list[str]:
    return ["--override-neuron-config", json.dumps(override, sort_keys=True)] if override else []


def _with_nodes(cmd: VllmCommand, argv: list[str], override: dict, nodes: int, tp: int) -> VllmCommand:
    """Per-node launch lines for the AWS Neuron fork's multi-node runner (env as in its run_*_nodes.sh)."""
    local = tp // nodes
    per_node = []
    for rank in range(nodes):
        env = {**cmd.env, "MASTER_ADDR": MASTER_ADDR_REF,
               "NEURON_RT_ROOT_COMM_ID": f"{MASTER_ADDR_REF}:{ROOT_COMM_PORT}",
               "CPU_COMM_ID": f"{MASTER_ADDR_REF}:{CPU_COMM_PORT}", "NEURON_RANK_ID": str(rank),
               "NEURON_LOCAL_TP": str(local), "WORLD_SIZE": str(nodes), "NEURON_MULTI_NODE": "True"}
        node_override = {**override, "start_rank_id": rank * local, "local_ranks_size": local}
        node_argv = [argv[0], MULTI_NODE_RUNNER] + argv[3:]  # the runner takes the api_server's flags
        per_node.append(VllmCommand(node_argv + _override_args(node_override), env))
    notes = cmd.notes + ["multi-node serving needs the AWS Neuron fork of vLLM (aws-neuron/upstreaming-to-vllm) and "
                         f"its {MULTI_NODE_RUNNER}; vLLM mainline runs tensor parallelism within one node only"]
    return VllmCommand(cmd.argv, cmd.env, per_node=per_node, notes=notes)


def _module_of(argv: list[str]) -> str | None:
    return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None


def _quote_env(value: str) -> str:
    # ${MASTER_ADDR} placeholders must stay expandable by the shell that runs the line
    if _ENV_REF.fullmatch(value):
        return f'"{value}"'
    return shlex.quote(value)
