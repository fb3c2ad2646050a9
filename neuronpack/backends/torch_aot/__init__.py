"""The portable torch backend: torch.export + AOTInductor graphs of the portable models (models/: one decoder,
one module per family), for any CPU.

``TorchAotBackend`` implements the ``Backend`` protocol (build side); ``load_artifact`` returns the runtime-facing
``CompiledLM`` (prefill / decode over a KV cache it owns). Importing this package does not import torch, nor the
build and load modules until they are used (a cache-hit compile needs only ``target``).

Example::

    backend = TorchAotBackend()
    backend.target(recipe)                      # torch-free: torch version, CPU capability, C++ compiler, ...
    info = backend.build(BuildRequest(model_dir, recipe, plan, staging))
    lm = load_artifact(published_dir)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.backends.base import Availability, BuildRequest
from neuronpack.backends.torch_aot.layout import FORMAT_VERSION, GRAPHS_FILE, KERNELS_LIBRARY
from neuronpack.backends.torch_aot.target import current_target, cxx_compiler, effective_compiler, torch_version
from neuronpack.lazy import lazy_attributes

if TYPE_CHECKING:
    from neuronpack.artifacts.manifest import Manifest

__all__ = ["CompiledLM", "TorchAotBackend", "load_artifact"]
__getattr__ = lazy_attributes(__name__, {"CompiledLM": "load", "load_artifact": "load"})


class TorchAotBackend:
    """Backend "torch": builds graphs.pt2 + weights/ + neuron_config.json (see build.py, artifact_config.py)."""

    name = "torch"
    quantizes_on_load = False  # runs NxDI-format quantized checkpoints made by `neuronpack quantize`
    checks_accuracy_before_compile = False  # the check runs the built artifact against transformers
    # host-side sampling: the graphs return logits, the runtime samples with the request's (or these default) values
    graph_key_ignores = ("sampling",)

    def availability(self) -> Availability:
        if importlib.util.find_spec("torch") is None:
            return Availability(False, "torch is not installed (pip install torch)")
        cxx = cxx_compiler()
        if cxx is None:
            return Availability(True, f"torch {torch_version()}; no C++ compiler found: export-only graphs")
        return Availability(True, f"torch {torch_version()} with {cxx['version']} (AOTInductor)")

    def versions(self) -> dict[str, str]:
        return {"torch": torch_version()}

    def target(self, recipe) -> dict[str, Any]:
        # The artifact format is part of the key: a neuronpack that writes another format must rebuild, not take an
        # old artifact for a cache hit that it then refuses to load.
        target = current_target(effective_compiler(recipe.compiler), recipe.instance_for("torch"))
        return {**target, "format_version": FORMAT_VERSION}

    def compile_config(self, request: BuildRequest) -> dict[str, Any]:
        from neuronpack.backends.torch_aot.build import artifact_config

        return artifact_config(request).compile_config()  # without the target: reported by target()

    def build(self, request: BuildRequest) -> dict[str, Any]:
        from neuronpack.backends.torch_aot.build import build_artifact

        return build_artifact(request)

    def graph_files(self, paths) -> list[str]:
        # every graph in one package; the kernels library the graphs call (built for this CPU from sources the graph
        # key holds); weights, draft, adapters and config are rewritten from the new checkpoint
        return [p for p in paths if p in (GRAPHS_FILE, KERNELS_LIBRARY)]

    def graph_reuse_problem(self) -> str | None:
        return None

    def validate_artifact(self, artifact_dir: Path, manifest: Manifest) -> None:
        from neuronpack.backends.torch_aot.artifact_config import read_artifact_config
        from neuronpack.backends.torch_aot.validate import check_loadable

        check_loadable(artifact_dir, read_artifact_config(artifact_dir).target)
