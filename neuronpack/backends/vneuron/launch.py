"""`neuronpack serve` for a vneuron artifact: ``vllm serve`` with the compiled arguments, every graph a cache hit.

The artifact's ``compile_cache/`` is handed, read-only, to the plugin's own remote-cache mechanism and the server
gets a fresh writable local root (vllm_neuron/compile/backend.py and cache.py, 0.21):

- ``VLLM_CACHE_ROOT=<fresh dir>``: the local root is ``$VLLM_CACHE_ROOT/neuron/compile_cache`` (envs.py's resolver
  takes an explicit VLLM_CACHE_ROOT as is: no NFS probe, no /tmp fallback);
- ``VLLM_NEURON_REMOTE_CACHE=<artifact>/compile_cache``: on a local miss, ``fetch_remote_or_compile`` copies the
  complete entry (``copytree`` to ``<key>.tmp.<pid>``, then rename) instead of running neuronx-cc;
- ``VLLM_NEURON_ASSERT_CACHE_HIT=1``: a key the artifact lacks raises at start (the remote miss is an error) instead
  of an hour of compiling; ``VLLM_NEURON_DISABLE_WARMUP_COMPILE`` is not set, as it raises on a LOCAL miss before the
  remote is consulted, and ``VLLM_NEURON_DISABLE_COMPILE_CACHE`` / ``VLLM_NEURON_CPU_COMPILE`` are forced off;
- 0.24 moved this code into libtorch-neuronx-lite and renamed the variables ``NEURON_LIBTORCH_*``: its documented
  ``NEURON_LIBTORCH_REMOTE_CACHE`` is set too, and ``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` by the rename's pattern
  (that library's source could not be read; docs/neuron.md says so);
- ``NEURON_PLATFORM_TARGET_OVERRIDE`` and ``NEURON_LOGICAL_NC_CONFIG`` as compiled (``resolve_target`` reads the
  variable first, so the pod hashes the build box's ``--target``).

Example::

    cmd = plugin_serve_command(Path("/art/ab12..."), manifest, host="0.0.0.0", port=8000)
    cmd.env["VLLM_NEURON_REMOTE_CACHE"]     # "/art/ab12.../compile_cache"
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from neuronpack.artifacts.manifest import Manifest
from neuronpack.backends.vllm.launch import API_SERVER, VllmCommand
from neuronpack.backends.vneuron.backend import plugin_cache_root
from neuronpack.backends.vneuron.cache import CACHE_DIR
from neuronpack.backends.vneuron.config import PluginConfig
from neuronpack.errors import ServeError

TARGET = "vneuron"


def default_cache_base(key: str) -> Path:
    """The server's writable ``VLLM_CACHE_ROOT``: one per artifact key under the temporary directory."""
    return Path(tempfile.gettempdir()) / "neuronpack-vllm" / key


def serve_env(artifact_dir: Path, config: PluginConfig, cache_base: Path) -> dict[str, str]:
    """The environment ``vllm serve`` needs so that every graph comes from the artifact (see the module docstring)."""
    remote = str(Path(artifact_dir).absolute() / CACHE_DIR)
    return {**config.env, "VLLM_CACHE_ROOT": str(cache_base), "VLLM_NEURON_REMOTE_CACHE": remote,
            "VLLM_NEURON_ASSERT_CACHE_HIT": "1", "VLLM_NEURON_DISABLE_COMPILE_CACHE": "0",
            "VLLM_NEURON_CPU_COMPILE": "0", "NEURON_LIBTORCH_REMOTE_CACHE": remote,
            "NEURON_LIBTORCH_ASSERT_CACHE_HIT": "1"}


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
    argv = [python, "-m", API_SERVER, "--model", model, "--host", host, "--port", str(port)]
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
    notes.append(f"the plugin's local cache root is {plugin_cache_root(base)}; every graph is fetched from the "
                 "artifact, and a missing one stops the server at start (VLLM_NEURON_ASSERT_CACHE_HIT)")
    return VllmCommand(argv, serve_env(artifact_dir, config, base), cwd=None, notes=notes, target=TARGET)


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
