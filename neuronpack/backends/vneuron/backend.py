"""The SDK 2.31+ vLLM Neuron plugin backend (framework ``vneuron``): the plugin's CPU compile, packaged.

The build runs upstream's own CPU compile (run.py) with a fresh cache root inside the staging directory, then
packages the complete entries (cache.py) as ``compile_cache/<32 hex>/`` of the artifact. The key holds the plugin,
vLLM, neuronx-cc, torch-neuronx / libtorch-neuronx-lite and NKI versions (``versions``), target and LNC
(``target``), the recipe (so every serve argument, config.py) and the weights by content, as for the other
frameworks: the pod loads the weights itself, the artifact carries only the compiled graphs.

Written against vllm-neuron 0.21's source (../shared/upstream/vllm-neuron-0.21, PROVENANCE.md) and 0.24's docs;
held by tests to that source's cache code with a stand-in CPU compile; never run with the real plugin, neuronx-cc or
a Trn2 here.

Example::

    VneuronBackend().compile_config(request)["vllm_flags"]   # ["--tensor-parallel-size", "32", ...]
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.backends.base import Availability, BuildRequest
from neuronpack.backends.neuron.common import read_model_config
from neuronpack.backends.neuron.packages import probe_package, sdk_availability, versions_of
from neuronpack.backends.vneuron.cache import CACHE_DIR, check_packaged, metadata_versions, package_entries
from neuronpack.backends.vneuron.config import plugin_config, recipe_lnc, vneuron_instance
from neuronpack.errors import ArtifactError, BuildError, UnsupportedModelError

if TYPE_CHECKING:  # annotations only: a cache hit (target, versions) imports no pydantic
    from neuronpack.artifacts.manifest import Manifest
    from neuronpack.recipe import Recipe

# what a compiled entry depends on (create_cache_hash hashes torch-neuronx, neuronx-cc and NKI versions; the plugin
# and vLLM decide the captured graphs); libtorch-neuronx-lite holds the cache code from 0.24 on
VNEURON_DISTS = ("vllm-neuron", "vllm", "neuronx-cc", "torch-neuronx", "libtorch-neuronx-lite", "nki")
# The plugin's model registry (vllm_neuron/model/registry.py get_models(), which NeuronWorker registers with vLLM:
# vllm_neuron/vllm/worker/neuron_worker.py:249-251 of the pinned 0.21 tree). 0.21's registry file is not in that
# partial tree: its public copies all hold these five entries; 0.24's docs list the same models (Llama + its EAGLE-3
# draft, gpt-oss, Qwen3, Qwen3-VL). A checkpoint is built for what the registry serves as a target: not the draft.
PLUGIN_REGISTRY = {
    "0.21": ("LlamaForCausalLM", "GptOssForCausalLM", "Eagle3LlamaForCausalLM", "Qwen3ForCausalLM",
             "Qwen3VLForConditionalGeneration"),
    "0.24": ("LlamaForCausalLM", "GptOssForCausalLM", "Eagle3LlamaForCausalLM", "Qwen3ForCausalLM",
             "Qwen3VLForConditionalGeneration"),
}
DRAFT_ONLY = ("Eagle3LlamaForCausalLM",)
ARCHITECTURES = tuple(dict.fromkeys(a for archs in PLUGIN_REGISTRY.values() for a in archs if a not in DRAFT_ONLY))
WORK_DIR = ".vneuron-work"  # inside staging while the compile runs; removed before the manifest is written


def plugin_cache_root(vllm_cache_root: Path) -> Path:
    """The compile-cache root the plugin uses for an explicit ``VLLM_CACHE_ROOT`` (envs.get_neuron_compile_cache_dir:
    ``$VLLM_CACHE_ROOT/neuron/compile_cache``)."""
    return Path(vllm_cache_root) / "neuron" / "compile_cache"


class VneuronBackend:
    """Backend protocol implementation for the vLLM Neuron plugin. See the module docstring."""

    name = "vneuron"
    quantizes_on_load = True  # no offline NxDI quantization: the plugin quantizes through its own neuron_config
    checks_accuracy_before_compile = False
    # the CPU compile's time limit: how long neuronpack waits, not an input of any captured graph
    graph_key_ignores = ("vneuron.compile_timeout",)

    def availability(self) -> Availability:
        from neuronpack.backends.neuron.support_matrix import installed_versions, is_new_plugin, pairing_of

        available = sdk_availability("vllm_neuron")  # the plugin imports and the Neuron compiler is there
        if not available.ok:
            return available
        plugin, vllm = probe_package("vllm_neuron"), probe_package("vllm")
        if not is_new_plugin(plugin.version):
            return Availability(False, f"vllm-neuron {plugin.version} is the classic NxDI plugin, not the SDK 2.31+ "
                                       "one (0.21 / 0.24)")
        if not vllm.ok:
            return Availability(False, vllm.reason)
        pairing = pairing_of(installed_versions(), target=self.name)
        if pairing is None:
            return Availability(False, f"vllm-neuron {plugin.version} with vllm {vllm.version} is not a stack "
                                       "neuronpack packages for (vllm-neuron 0.21 / 0.24 with their vLLM: "
                                       "docs/neuron.md, support matrix)")
        return Availability(False, f"{pairing.name}: {pairing.refused}") if pairing.refused else available

    def versions(self) -> dict[str, str]:
        return versions_of(VNEURON_DISTS)

    def target(self, recipe: Recipe) -> dict[str, Any]:
        instance = vneuron_instance(recipe)
        return {"instance": instance, "platform_target": instance, "lnc": recipe_lnc(recipe)}

    def compile_config(self, request: BuildRequest) -> dict[str, Any]:
        """vLLM's flags, the neuron_config and the environment both starts use (config.py), JSON-able."""
        hf_config = read_model_config(request.model_dir, allow_missing=True)
        architecture = (hf_config.get("architectures") or ["?"])[0]
        if hf_config and architecture not in ARCHITECTURES:
            raise UnsupportedModelError(
                f"{architecture} is not a model neuronpack builds for the vLLM Neuron plugin",
                where=str(Path(request.model_dir) / "config.json"),
                fix=f"use one of {', '.join(ARCHITECTURES)}, or --framework nxd")
        return {"architecture": architecture, **plugin_config(request.recipe, hf_config).to_dict()}

    def build(self, request: BuildRequest) -> dict[str, Any]:
        """The plugin's CPU compile into a fresh root inside staging; its complete entries into compile_cache/."""
        from neuronpack.backends.vneuron.run import run_cpu_compile

        availability = self.availability()
        if not availability.ok:
            raise BuildError(f"the vLLM Neuron plugin cannot build here: {availability.reason}",
                             where="framework vneuron", fix="compile on a machine (or image) with the SDK 2.31+ vllm, "
                                                            "vllm-neuron and neuronx-cc, or use --dry-run")
        request = dataclasses.replace(request, model_dir=Path(request.model_dir).absolute(),
                                      staging=Path(request.staging).absolute())
        if request.donor is not None:  # entries are keyed on the FX graph, never the weights: they carry over as is
            entries = check_packaged(request.staging / CACHE_DIR, metadata_versions(self.versions()["vllm-neuron"]))
            self._copy_model_files(request)
            return {"vneuron": {"entries": entries}}
        config = plugin_config(request.recipe, read_model_config(request.model_dir))
        readable = metadata_versions(self.versions()["vllm-neuron"])  # what the pod's loader will read
        work = request.staging / WORK_DIR
        work.mkdir()
        log = request.staging.parent / f"{request.staging.name}.vneuron-compile.log"  # kept when the build fails
        seconds = run_cpu_compile(config, model_dir=request.model_dir, cache_base=work / "vllm-cache",
                                  log_path=log, reporter=request.reporter)
        try:
            packed = package_entries(plugin_cache_root(work / "vllm-cache"), request.staging / CACHE_DIR, readable)
        except BuildError as exc:  # the staging directory goes with the failed build: point at the kept log
            raise BuildError(exc.what, where=str(log), fix=exc.fix) from None
        shutil.rmtree(work)
        log.unlink(missing_ok=True)
        self._copy_model_files(request)
        request.reporter.info(f"packaged {packed.entries} compile-cache entries ({packed.nki} NKI results, "
                              f"{packed.dropped} lock / debug files left out)")
        return {"vneuron": {"entries": packed.entries, "nki": packed.nki, "bytes": packed.bytes,
                            "dropped_files": packed.dropped, "compile_seconds": round(seconds, 1)}}

    @staticmethod
    def _copy_model_files(request: BuildRequest) -> None:
        from neuronpack.checkpoint import copy_aux_files

        shutil.copy2(request.model_dir / "config.json", request.staging / "config.json")
        copy_aux_files(request.model_dir, request.staging)

    def graph_files(self, paths) -> list[str]:
        # the packaged compile cache (entries keyed by create_cache_hash: FX graph, shapes, compiler versions and
        # arguments; the CPU compile runs the model on the meta device, so no weight reaches an entry)
        return [p for p in paths if p.startswith(f"{CACHE_DIR}/")]

    def graph_reuse_problem(self) -> str | None:
        return None

    def validate_artifact(self, artifact_dir: Path, manifest: Manifest) -> None:
        """The packaged cache is there and every entry complete (versions: check_toolchain, before this)."""
        cache = Path(artifact_dir) / CACHE_DIR
        try:
            readable = metadata_versions(manifest.versions.get("vllm-neuron"))
        except BuildError as exc:
            raise ArtifactError(exc.what, where=str(artifact_dir), fix=exc.fix) from None
        if check_packaged(cache, readable) == 0:
            raise ArtifactError("the artifact holds no compile-cache entry", where=str(cache),
                                fix="rebuild it with `neuronpack compile --force`")
