"""Start vLLM on a neuronpack artifact: the launch spec read from the manifest, the target's command, the checks.

vLLM loads a precompiled Neuron artifact only through ``NEURON_COMPILED_ARTIFACTS`` (used as-is). It never compares
its own flags with the artifact: it builds a default NeuronConfig from them, loads neuron_config.json, and when that
raises FileNotFoundError / ValueError it compiles *into that directory*. So every flag that must equal the artifact
(tensor parallel, max-num-seqs, max-model-len, max_prompt_length, dtype, speculation tokens, LoRA) is derived from the
manifest here, the artifact is verified before launch (artifacts/verify.py) and its files are read-only, and vLLM runs
with the artifact as working directory (NxDI resolves LoRA adapter paths, recorded relative to it, from there).

Each serving target has its own module (vllm_v0.py: V0 mainline 0.9 and the AWS fork; vllm_plugin.py: the V1
vllm-neuron plugin); vllm_targets.py picks one; support_matrix.py says which versions pair.

Example::

    cmd = vllm_command(artifact, read_manifest(artifact), target="vllm-neuron", port=8080)  # vllm_targets
    print(format_command(cmd))
    # cd /art/abc && NEURON_COMPILED_ARTIFACTS=/art/abc VLLM_NEURON_FRAMEWORK=... python -m vllm.entrypoints...
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuronpack.artifacts.manifest import Manifest
from neuronpack.backends.neuron.common import FRAMEWORK_TO_VLLM
from neuronpack.errors import ArtifactError, ServeError

API_SERVER = "vllm.entrypoints.openai.api_server"
# NeuronConfig fields holding config objects: never passed as overrides (vLLM setattr's them onto the loaded config,
# and a plain dict there would replace the OnDeviceSamplingConfig / LoraServingConfig object)
NESTED_FIELDS = ("on_device_sampling_config", "lora_config")
_AMP_TO_DTYPE = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class VllmCommand:
    argv: list[str]
    env: dict[str, str]  # only the variables neuronpack sets; the rest of the environment is inherited
    cwd: str | None = None  # run vLLM here (the artifact: LoRA paths in neuron_config.json are relative to it)
    notes: list[str] = field(default_factory=list)
    target: str = ""
    launched_elsewhere: bool = False  # multi-node: the line is run with mpirun from the head node, not exec'd here


@dataclass(frozen=True)
class LoraSpec:
    adapters: tuple[tuple[str, str], ...]  # (name, absolute path)
    max_loras: int
    max_rank: int
    target_modules: tuple[str, ...]


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a serving target needs from an artifact (the one place that reads the manifest for launching)."""

    artifact_dir: Path
    framework: str  # "nxd" | "tnx"
    model: str  # --model: the artifact itself when it carries its weights
    served_model_name: str | None
    tensor_parallel_size: int
    max_num_seqs: int
    max_model_len: int
    max_context_length: int
    dtype: str
    override: dict[str, Any]  # NeuronConfig fields vLLM's defaults would get wrong (nxd) / recipe overrides (tnx)
    speculation_length: int = 0
    architecture: str | None = None  # the checkpoint's HF architecture (which loader class vLLM picks)
    draft: str | None = None
    eagle: bool = False
    lora: LoraSpec | None = None
    nodes: int = 1
    env: dict[str, str] = field(default_factory=dict)  # framework-specific variables (TNx buckets)
    tnx_quantized: bool = False
    on_device_sampling: bool = True  # the artifact samples on device (no host logits for grammars: vllm_structured)
    versions: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def launch_spec(artifact_dir: Path, manifest: Manifest | dict[str, Any]) -> LaunchSpec:
    """Read what serving needs from the manifest (ArtifactError when it is not a vLLM artifact or is incomplete).
    Accepts the typed Manifest (read_manifest) or its JSON form."""
    artifact_dir = Path(artifact_dir).absolute()
    if isinstance(manifest, Manifest):
        manifest = manifest.model_dump(mode="json", by_alias=True)
    framework = manifest.get("framework")
    if framework not in FRAMEWORK_TO_VLLM:
        raise ArtifactError(
            f"vLLM serves nxd and tnx artifacts; this one was built for {framework!r}", where=str(artifact_dir),
            fix="serve it with `neuronpack serve` (portable runtime) or rebuild with --framework nxd")
    serve = manifest.get("serve") or {}
    config = manifest.get("compile_config") or {}
    seq_len = int(_required(serve, "max_model_len", artifact_dir))
    common = {
        "artifact_dir": artifact_dir, "framework": framework, "served_model_name": serve.get("served_model_name"),
        "tensor_parallel_size": int(_required(serve, "tensor_parallel_size", artifact_dir)),
        "max_num_seqs": int(_required(serve, "max_num_seqs", artifact_dir)), "max_model_len": seq_len,
        "nodes": int(serve.get("nodes") or 1), "versions": dict(manifest.get("versions") or {}),
    }
    if framework == "tnx":
        return _tnx_spec(manifest, config, common)
    neuron_config = config.get("neuron_config")
    if not isinstance(neuron_config, dict):
        raise ArtifactError("the manifest has no compile_config.neuron_config", where=str(artifact_dir),
                            fix="rebuild the artifact with this neuronpack version")
    speculation = int(serve.get("speculation_length") or 0)
    notes: tuple[str, ...] = ()
    model = str(artifact_dir)
    if not neuron_config.get("save_sharded_checkpoint"):
        model = str((manifest.get("model") or {}).get("path"))
        notes = (f"weights are sharded on load from {model}: keep it reachable",)
    return LaunchSpec(
        **common, model=model, max_context_length=int(neuron_config.get("max_context_length") or seq_len),
        dtype=str(neuron_config.get("torch_dtype", "auto")), architecture=config.get("architecture"),
        override=_override(config, neuron_config, speculation=bool(speculation)),
        speculation_length=speculation, draft=_draft(artifact_dir, serve) if speculation else None,
        eagle=bool(neuron_config.get("enable_eagle_speculation")), lora=_lora(artifact_dir, serve, manifest),
        on_device_sampling=neuron_config.get("on_device_sampling_config") is not None, notes=notes)


def _override(config: dict, neuron_config: dict, *, speculation: bool) -> dict:
    """The override vLLM gets; an image-to-text artifact (Llama 4: a text and a vision NeuronConfig) as vllm-neuron's
    image-to-text loader takes it, ``{"text_neuron_config": ..., "vision_neuron_config": ...}`` (any other key fails
    its _validate_image_to_text_override_neuron_config)."""
    if isinstance(config.get("vision_neuron_config"), dict):
        return {"text_neuron_config": neuron_override(neuron_config),
                "vision_neuron_config": neuron_override(config["vision_neuron_config"])}
    return neuron_override(neuron_config, speculation=speculation)


def base_env(spec: LaunchSpec) -> dict[str, str]:
    return {"NEURON_COMPILED_ARTIFACTS": str(spec.artifact_dir), "VLLM_NEURON_FRAMEWORK": FRAMEWORK_TO_VLLM[
        spec.framework], **spec.env}


def server_args(spec: LaunchSpec, *, host: str, port: int, api_key: str | None, python: str) -> list[str]:
    """The OpenAI server's own flags, the same on every target."""
    argv = [python, "-m", API_SERVER, "--model", spec.model, "--host", host, "--port", str(port)]
    if spec.served_model_name:
        argv += ["--served-model-name", spec.served_model_name]
    if api_key:
        argv += ["--api-key", api_key]
    return argv


def lora_args(lora: LoraSpec) -> list[str]:
    return ["--enable-lora", "--max-loras", str(lora.max_loras), "--max-lora-rank", str(lora.max_rank),
            "--lora-modules", *[f"{name}={path}" for name, path in lora.adapters]]


def neuron_override(neuron_config: dict, *, speculation: bool = False) -> dict:
    """The NeuronConfig fields that differ from what vLLM builds from its own flags (tp, max_num_seqs,
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


def format_command(cmd: VllmCommand) -> str:
    """Shell-quoted: ``cd DIR &&`` when a working directory is set, then the environment, then argv.

    Example::

        format_command(VllmCommand(["python", "-m", "x"], {"A": "1 2"}))   # "A='1 2' python -m x"
    """
    env = " ".join(f"{k}={_quote_env(v)}" for k, v in cmd.env.items())
    argv = " ".join(_quote_arg(a) for a in cmd.argv)
    line = f"{env} {argv}" if env else argv
    return f"cd {shlex.quote(cmd.cwd)} && {line}" if cmd.cwd else line


def run_vllm(cmd: VllmCommand) -> None:
    """Replace this process with vLLM (never returns), in cmd.cwd. ServeError when the module is not importable or
    the command is a multi-node one (run with mpirun from the head node)."""
    if cmd.launched_elsewhere:
        raise ServeError("a multi-node artifact is launched with mpirun from the head node, not from here",
                         where="target.nodes", fix="run the line from `neuronpack serve --print-command` there")
    module = _module_of(cmd.argv)
    if module and Path(cmd.argv[0]).resolve() == Path(sys.executable).resolve():
        if importlib.util.find_spec(module.split(".")[0]) is None:
            raise ServeError(f"{module.split('.')[0]} is not installed in this Python", where=sys.executable,
                             fix="install vLLM with Neuron support on the Neuron machine (see docs/neuron.md), "
                                 "or print the command with --print-command")
    if cmd.cwd:
        os.chdir(cmd.cwd)
    os.execvpe(cmd.argv[0], cmd.argv, {**os.environ, **cmd.env})


# --- private ---------------------------------------------------------------------------------------------------------
_ENV_REF = re.compile(r"\$\{[A-Z_][A-Z0-9_]*\}(:\d+)?")


def _required(serve: dict, name: str, artifact_dir: Path):
    if serve.get(name) is None:
        raise ArtifactError(f"the manifest has no serve.{name}", where=str(artifact_dir),
                            fix="rebuild the artifact with this neuronpack version")
    return serve[name]


def _tnx_spec(manifest: dict, config: dict, common: dict) -> LaunchSpec:
    fp = config.get("from_pretrained") or {}
    env = {"NEURON_CONTEXT_LENGTH_BUCKETS": ",".join(str(b) for b in fp.get("context_length_estimate", [])),
           "NEURON_TOKEN_GEN_BUCKETS": ",".join(str(b) for b in fp.get("n_positions", []))}
    quant = (config.get("neuron_config") or {}).get("quant")
    if quant:
        env["NEURON_QUANT_DTYPE"] = quant["quant_dtype"]
    recipe_overrides = (manifest.get("recipe") or {}).get("neuron_overrides") or {}
    notes = ("vLLM's transformers-neuronx path ignores NEURON_COMPILED_ARTIFACTS and compiles at start-up with its "
             "own defaults plus these bucket variables: the artifact's NEFFs are not reused, and the same graphs "
             "are not promised",)
    contexts = fp.get("context_length_estimate") or [common["max_model_len"]]
    return LaunchSpec(**common, model=str((manifest.get("model") or {}).get("path")),
                      max_context_length=int(max(contexts)), dtype=_AMP_TO_DTYPE.get(fp.get("amp"), "auto"),
                      override=dict(recipe_overrides), env=env, tnx_quantized=bool(quant),
                      on_device_sampling="on_device_generation" in (config.get("neuron_config") or {}), notes=notes)


def _draft(artifact_dir: Path, serve: dict) -> str:
    bundled = artifact_dir / "draft"
    draft = str(bundled) if (bundled / "config.json").is_file() else serve.get("draft_path")
    if not draft:
        raise ArtifactError("the artifact speculates but records no draft", where=str(artifact_dir),
                            fix="rebuild it with `neuronpack compile --force`")
    return draft


def _lora(artifact_dir: Path, serve: dict, manifest: dict) -> LoraSpec | None:
    from neuronpack.checkpoint.lora import lora_path

    modules = serve.get("lora_modules") or []
    if not modules:
        return None
    lora = (manifest.get("recipe") or {}).get("lora") or {}
    adapters = []
    for module in modules:
        inside = artifact_dir / lora_path(module["name"])
        adapters.append((module["name"], str(inside) if inside.exists() else str(module["path"])))
    return LoraSpec(tuple(adapters), int(lora.get("max_loras", len(modules))), int(lora.get("max_rank", 16)),
                    tuple(lora.get("target_modules") or ()))


def _module_of(argv: list[str]) -> str | None:
    return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None


def _quote_env(value: str) -> str:
    # ${MASTER_ADDR} placeholders must stay expandable by the shell that runs the line
    return f'"{value}"' if _ENV_REF.fullmatch(value) else shlex.quote(value)


def _quote_arg(value: str) -> str:
    return f'"{value}"' if _ENV_REF.search(value) and "'" not in value and '"' not in value else shlex.quote(value)
