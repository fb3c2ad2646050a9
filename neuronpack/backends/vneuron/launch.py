"""`neuronpack serve` for a vneuron artifact: ``vllm serve`` with the compiled arguments, every graph a local hit.

Read from vllm-neuron 0.21's source (../shared/upstream: envs.py, compile/backend.py, capture_backend.py,
parallel_compile.py) and 0.24's docs (design/compilation/compilation_cache.md, cpu_compilation.md):

- a device start first CAPTURES every graph whose entry is not in the LOCAL root and ``parallel_compile`` runs
  neuronx-cc on each, consulting neither the remote cache nor ``VLLM_NEURON_ASSERT_CACHE_HIT`` (capture_backend.py,
  parallel_compile.py, 0.21). So an empty local root plus a remote cache, what this module used to set, recompiled
  every graph at start without an error. Instead the pod fills the local root from the artifact at every start
  (pod.py), so every lookup is a local hit, which is also how 0.24's docs have production use a CPU-compiled cache
  ("synced to the local cache directory");
- ``VLLM_CACHE_ROOT=<dir>``: the local root is ``$VLLM_CACHE_ROOT/neuron/compile_cache`` (0.21's envs.py takes an
  explicit VLLM_CACHE_ROOT as is; 0.24's docs give the same path);
- ``VLLM_NEURON_DISABLE_WARMUP_COMPILE=1``: a local miss raises instead of compiling (0.21 backend.py; the same name
  in 0.24's docs); ``VLLM_NEURON_DISABLE_GRAPH_CAPTURE_BACKEND=1`` (0.21 envs.py) and
  ``NEURON_LIBTORCH_DISABLE_GRAPH_CAPTURE_BACKEND=1`` (0.24's cpu_compilation.md, "Preventing Compilation on
  Production Instances"): no capture and parallel compile at start; the compile cache is forced on and CPU compile
  off under both names. No remote cache is set: every entry is local. ``NEURON_LIBTORCH_ASSERT_CACHE_HIT``, which an
  earlier version set by analogy, is named by no AWS page and is not set;
- ``NEURON_PLATFORM_TARGET_OVERRIDE`` and ``NEURON_LOGICAL_NC_CONFIG`` as compiled (``resolve_target`` reads the
  variable first, so the pod hashes the build box's ``--target``).

pod.py then checks with the installed plugin's own resolvers that these reach it, and watches the local root for a
compile the guards did not stop.

Example::

    cmd = plugin_serve_command(Path("/art/ab12..."), manifest, host="0.0.0.0", port=8000)
    cmd.env["VLLM_NEURON_DISABLE_WARMUP_COMPILE"]     # "1"
    cmd.argv[:4]      # [python, "-m", "neuronpack.backends.vneuron.pod", "/art/ab12..."]
"""

from __future__ import annotations

import sys
from pathlib import Path

from neuronpack.artifacts.manifest import Manifest
from neuronpack.artifacts.pod_caches import pod_cache_base
from neuronpack.backends.vllm.launch import API_SERVER, VllmCommand
from neuronpack.backends.vneuron.backend import plugin_cache_root
from neuronpack.backends.vneuron.config import PluginConfig
from neuronpack.backends.vneuron.variables import CACHE_ROOT, guard_env
from neuronpack.errors import ServeError

TARGET = "vneuron"
POD = "neuronpack.backends.vneuron.pod"  # what runs vLLM on the pod: fill, check, watch


def default_cache_base(key: str) -> Path:
    """The server's writable ``VLLM_CACHE_ROOT``: one per artifact key under the temporary directory (artifacts/
    pod_caches.py, which gc cleans)."""
    return pod_cache_base(key)


def serve_env(config: PluginConfig, cache_base: Path) -> dict[str, str]:
    """The environment ``vllm serve`` needs so that every graph is a local hit (see the module docstring and
    variables.py, where each name is confirmed)."""
    return {**config.env, CACHE_ROOT: str(cache_base), **guard_env()}


def plugin_serve_command(artifact_dir: Path, manifest: Manifest, *, host: str = "127.0.0.1", port: int = 8000,
                         api_key: str | None = None, python: str = sys.executable, weights: str | None = None,
                         cache_base: Path | None = None, tool_call_parser: str | None = None) -> VllmCommand:
    """The pod's vLLM command for a vneuron artifact. ``weights``: where vLLM reads the model here (default: what it
    was compiled from); a local directory must be the compiled checkpoint (config and tensors).
    ``tool_call_parser``: vLLM's ``--enable-auto-tool-choice --tool-call-parser NAME``, passed through."""
    if manifest.framework != TARGET:
        raise ServeError(f"this is a {manifest.framework} artifact, not a vneuron one", where=str(artifact_dir),
                         fix="serve it with `neuronpack serve` without forcing the vneuron path")
    config = PluginConfig.from_dict(manifest.compile_config)
    model, revision, notes = _weights(artifact_dir, manifest, weights)
    argv = [python, "-m", POD, str(Path(artifact_dir).absolute()), "--",
            python, "-m", API_SERVER, "--model", model, "--host", host, "--port", str(port)]
    if revision:
        argv += ["--revision", revision]
    if manifest.serve.served_model_name:
        argv += ["--served-model-name", manifest.serve.served_model_name]
    if api_key:
        argv += ["--api-key", api_key]
    argv += config.vllm_flags()
    if tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    base = cache_base or default_cache_base(manifest.key)
    notes.append(f"the plugin's local cache root {plugin_cache_root(base)} is made anew from the artifact at every "
                 "start; a graph it lacks stops the server at start (VLLM_NEURON_DISABLE_WARMUP_COMPILE, and "
                 "neuronpack watches that root)")
    return VllmCommand(argv, serve_env(config, base), cwd=None, notes=notes, target=TARGET)


def _weights(artifact_dir: Path, manifest: Manifest, weights: str | None) -> tuple[str, str | None, list[str]]:
    """(--model, --revision, notes): a local checkpoint (checked against the compiled one) or a hub id."""
    from neuronpack.checkpoint.hub import split_hub_id

    given = weights or manifest.model.path  # the build box's path, when it is on this machine too
    if given and Path(given).expanduser().is_dir():
        path = Path(given).expanduser().absolute()
        check_weights(path, manifest)
        return str(path), None, []
    hub = split_hub_id(weights or manifest.serve.model_source or "")
    if hub is None:
        raise ServeError("the checkpoint this artifact was compiled from is not on this machine",
                         where=str(weights or manifest.model.path or artifact_dir),
                         fix="pass --weights DIR (that checkpoint, as mounted here) or a hub id")
    return hub[0], hub[1], [f"vLLM loads the weights from the hub id {hub[0]!r} (or its local HF cache): they must be "
                            "the revision the artifact was compiled from"]


def check_weights(model_dir: Path, manifest: Manifest) -> None:
    """A local weights directory must hold the compiled checkpoint: the same config.json (cosmetic keys aside) and
    the same tensor names, dtypes and shapes (safetensors headers; file contents are not re-hashed at start)."""
    from neuronpack.artifacts.key import COSMETIC_CONFIG_KEYS
    from neuronpack.checkpoint import open_checkpoint

    recorded = (manifest.key_inputs.get("model") or {})
    ckpt = open_checkpoint(model_dir)
    config = {k: v for k, v in ckpt.config.items() if k not in COSMETIC_CONFIG_KEYS}
    if config != recorded.get("config"):
        raise ServeError("these weights' config.json differs from the checkpoint the artifact was compiled from",
                         where=str(model_dir), fix="point --weights at that checkpoint, or recompile for this one")
    tensors = (recorded.get("weights") or {}).get("tensors")
    if tensors is not None and ckpt.weight_identity() != tensors:
        raise ServeError("these weights' tensors (names, dtypes, shapes) differ from the compiled checkpoint's",
                         where=str(model_dir), fix="point --weights at that checkpoint, or recompile for this one")
