"""The NxD Inference backend (``neuronx-distributed-inference``): compile and artifact checks; the recipe ->
NeuronConfig mapping it compiles with is nxd_config.py (pure, torch-free).

Written against NxDI 0.9's documented API and source (``models/config.py``, ``models/application_base.py``) and
vLLM 0.9's loader (``vllm/model_executor/model_loader/neuronx_distributed.py``); proven by contract tests with a
stand-in SDK, never run on Neuron hardware here.

The compile is what vLLM would do on its first start, done ahead of time::

    neuron_config = model_cls.get_neuron_config_cls()(**kwargs)
    config = model_cls.get_config_cls()(neuron_config, load_config=load_pretrained_config(model_dir))
    model_cls(model_dir, config).compile(staging)   # neuron_config.json, model.pt, weights/tp{rank}_...

Example::

    backend = NxdBackend()
    backend.compile_config(request)["neuron_config"]["context_encoding_buckets"]   # [128, 256, ..., 8192]
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.backends.base import Availability, BuildRequest
from neuronpack.backends.neuron.common import import_class, neuron_instance, read_model_config, working_directory
from neuronpack.backends.neuron.packages import sdk_availability, versions_of
from neuronpack.backends.nxd.config import (
    check_eagle3_supported,
    check_speculation_kind,
    draft_neuron_config,
    model_family,
    nxd_neuron_config,
    vision_neuron_config,
    vision_plan,
)
from neuronpack.backends.nxd.families import architecture_of, checkpoint_problem, transformers4_overrides
from neuronpack.checkpoint.lora import copy_adapters, lora_path
from neuronpack.errors import ArtifactError, BuildError, CheckpointError, UnsupportedModelError

if TYPE_CHECKING:  # annotations only: a cache hit (target, versions) imports no pydantic
    from neuronpack.artifacts.manifest import Manifest
    from neuronpack.recipe import Recipe

NXD_DISTS = ("neuronx-distributed-inference", "neuronx-cc", "torch-neuronx")
COMPILED_FILES = ("neuron_config.json", "model.pt")
IMAGE_TO_TEXT_GRAPHS = ("text_model/model.pt", "vision_model/model.pt")


class NxdBackend:
    """Backend protocol implementation for NxD Inference. See the module docstring."""

    name = "nxd"
    quantizes_on_load = False
    checks_accuracy_before_compile = True  # NxDI's CPU run judges the checkpoint before neuronx-cc runs
    graph_key_ignores = ()  # sampling is compiled on device; every recipe field can reach the traced model

    def availability(self) -> Availability:
        return sdk_availability("neuronx_distributed_inference")

    def versions(self) -> dict[str, str]:
        return versions_of(NXD_DISTS)

    def target(self, recipe: Recipe) -> dict[str, Any]:
        instance = neuron_instance(recipe, "nxd")
        overrides = recipe.neuron_overrides
        return {
            "instance": instance,
            "platform_target": instance,  # NEURON_PLATFORM_TARGET_OVERRIDE
            "logical_nc_config": overrides.get("logical_nc_config"),
            "nodes": recipe.target.nodes,
        }

    def compile_config(self, request: BuildRequest) -> dict[str, Any]:
        """Everything the compile hands NxDI, JSON-able: the exact NeuronConfig kwargs, the class, the draft's."""
        recipe, plan = request.recipe, request.plan
        neuron_instance(recipe, "nxd")  # a CPU recipe is refused for its instance first
        # Before offline quantization has run (dry-run), the quantized directory does not exist yet: read the
        # architecture from the checkpoint it will be made from.
        config_dir = request.model_dir
        if not Path(config_dir).exists() and request.source_model_dir is not None:
            config_dir = request.source_model_dir
        hf_config = read_model_config(config_dir, allow_missing=recipe.quantization is not None)
        family = model_family(hf_config, where=str(request.model_dir))
        check_speculation_kind(recipe, family)
        _check_checkpoint(Path(config_dir), hf_config)
        neuron_config = nxd_neuron_config(recipe, plan, hf_config, request.model_dir, request.draft_dir,
                                          request.source_model_dir)
        check_eagle3_supported(neuron_config, self.versions().get("neuronx-distributed-inference"))
        out: dict[str, Any] = {
            "architecture": architecture_of(hf_config),
            "model_class": None if family is None else family.model_class,
            "platform_target": neuron_instance(recipe, "nxd"),
            "neuron_config": neuron_config,
        }
        if family is not None and family.text_class:
            out["vision_neuron_config"] = vision_neuron_config(recipe, neuron_config)
        renamed = transformers4_overrides(hf_config)
        if renamed:  # a transformers 5 config.json: what NxDI's transformers 4.57 would read otherwise
            out["config_overrides"] = renamed
        if recipe.speculation is not None:
            out["draft"] = {
                "path": None if request.draft_dir is None else str(request.draft_dir),
                "neuron_config": draft_neuron_config(neuron_config),
            }
        if family is not None and family.name == "mllama":
            out["vision"] = vision_plan(hf_config)
        if recipe.target.nodes > 1:
            out["multi_node"] = {"nodes": recipe.target.nodes,
                                 "local_ranks_size": recipe.target.tp_degree // recipe.target.nodes}
        return out

    def build(self, request: BuildRequest) -> dict[str, Any]:
        """Compile with NxDI into request.staging (needs the SDK; the platform target comes from the recipe)."""
        availability = self.availability()
        if not availability.ok:
            raise BuildError(f"NxD Inference cannot build here: {availability.reason}", where="framework nxd",
                             fix="compile on a machine with the Neuron SDK, or use --dry-run / --framework torch")
        # absolute paths: the compile runs inside the staging directory (see below)
        request = dataclasses.replace(
            request, model_dir=Path(request.model_dir).absolute(), staging=Path(request.staging).absolute(),
            draft_dir=None if request.draft_dir is None else Path(request.draft_dir).absolute())
        config = self.compile_config(request)
        os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = config["platform_target"]
        model_cls = import_class(config["model_class"])
        copy_lora_adapters(request)
        # lora_ckpt_paths are relative to the artifact: NxDI checks them at compile and at every load, so both run
        # with the artifact as working directory (serve starts vLLM there too)
        what = "shard weights, traced model reused" if request.donor else "compile"
        with request.reporter.task(f"NxDI {what} ({config['architecture']}, tp {request.recipe.target.tp_degree})"), \
                working_directory(request.staging):
            model = model_cls(str(request.model_dir),
                              inference_config(model_cls, config, request.model_dir, request.draft_dir))
            if request.donor is None:
                model.compile(str(request.staging))
            else:  # compile() minus the trace: the config it saves, then NxDI's own weight sharding
                model.config.save(str(request.staging))
                _shard_weights(model, str(request.staging), image_to_text="vision_neuron_config" in config)
        check_compiled(request.staging, config["neuron_config"], image_to_text="vision_neuron_config" in config)
        _copy_model_files(request)
        return {"nxd": {"model_class": config["model_class"], "platform_target": config["platform_target"]}}

    def graph_files(self, paths) -> list[str]:
        # the traced model with every bucket's NEFF; neuron_config.json is saved again (it names this checkpoint's
        # paths) and the weights are sharded again from the new checkpoint
        return [p for p in paths if p in ("model.pt", *IMAGE_TO_TEXT_GRAPHS)]

    def graph_reuse_problem(self) -> str | None:
        try:
            from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
        except Exception as exc:  # the SDK is absent or a placeholder: nothing is built here anyway
            return f"NxD Inference does not import ({type(exc).__name__})"
        if not hasattr(NeuronApplicationBase, "shard_weights"):
            return "this NxD Inference has no NeuronApplicationBase.shard_weights (weights cannot be sharded alone)"
        return None

    def validate_artifact(self, artifact_dir: Path, manifest: Manifest) -> None:
        """Files NxDI's load() reads are present, and this machine's NxDI / compiler / torch-neuronx are the ones
        the artifact was built with (NxDI itself records no compiler version)."""
        neuron_config = manifest.compile_config.get("neuron_config") or {}
        check_compiled(Path(artifact_dir), neuron_config,
                       image_to_text="vision_neuron_config" in manifest.compile_config)
        check_lora_adapters(Path(artifact_dir), neuron_config)
        if not neuron_config.get("save_sharded_checkpoint", False):
            model_path = Path(manifest.model.path or "")
            if not (model_path / "config.json").is_file():
                raise ArtifactError(
                    "this artifact shards weights on load and its checkpoint is gone",
                    where=str(model_path), fix="restore the checkpoint or rebuild with save_sharded_checkpoint=true")
        built, here = manifest.versions, self.versions()
        for dist in NXD_DISTS:
            if dist in built and built[dist] != here.get(dist):
                raise ArtifactError(
                    f"built with {dist} {built[dist]}, this machine has {here.get(dist)}", where=str(artifact_dir),
                    fix=f"install {dist}=={built[dist]} from the Neuron repository or rebuild here")


def copy_lora_adapters(request: BuildRequest) -> None:
    """Copy every recipe adapter into ``staging/lora/<name>/`` so the artifact carries them (NxDI re-checks each
    lora_ckpt_paths entry whenever neuron_config.json is loaded; build-time paths would be gone on the server)."""
    dirs = request.adapter_dirs()
    copy_adapters(dirs, request.staging, {name: lora_path(name) for name in dirs})


def check_lora_adapters(artifact_dir: Path, neuron_config: dict) -> None:
    """Every adapter in lora_config.lora_ckpt_paths is inside the artifact and present (else vLLM's load raises
    FileNotFoundError and it recompiles)."""
    paths = ((neuron_config.get("lora_config") or {}).get("lora_ckpt_paths") or {})
    for name, rel in sorted(paths.items()):
        path = Path(artifact_dir) / str(rel)
        if Path(str(rel)).is_absolute() or ".." in Path(str(rel)).parts or not path.exists():
            raise ArtifactError(f"LoRA adapter {name!r} is not inside the artifact ({rel})", where=str(artifact_dir),
                                fix="rebuild it with `neuronpack compile --force` (adapters are copied in)")


def check_compiled(artifact_dir: Path, neuron_config: dict, *, image_to_text: bool = False) -> None:
    """The files NxDI's compile writes and its load reads: neuron_config.json, model.pt (an image-to-text model:
    text_model/model.pt and vision_model/model.pt, models/image_to_text_model_base.py compile), weights/tp{rank}_*."""
    for name in (("neuron_config.json", *IMAGE_TO_TEXT_GRAPHS) if image_to_text else COMPILED_FILES):
        if not (artifact_dir / name).is_file():
            raise ArtifactError(f"NxDI artifact is missing {name}", where=str(artifact_dir / name),
                                fix="rebuild it with `neuronpack compile --force`")
    if neuron_config.get("save_sharded_checkpoint"):
        world = int(neuron_config.get("world_size") or neuron_config.get("tp_degree") or 1)
        for rank in range(world):
            shard = artifact_dir / "weights" / f"tp{rank}_sharded_checkpoint.safetensors"
            if not shard.is_file():
                raise ArtifactError(f"NxDI artifact is missing the rank {rank} weights", where=str(shard),
                                    fix="rebuild it with `neuronpack compile --force`")


def inference_config(model_cls, config: dict, model_dir: Path, draft_dir: Path | None):
    """NeuronConfig + InferenceConfig (and the FusedSpecNeuronConfig for speculation), as vLLM 0.9 builds them, from
    a compile config (``compile_config`` / the CPU check's kwargs); the build and accuracy/nxdi_cpu.py both use it.
    A transformers 5 config.json's renamed keys are given in the names NxDI's transformers 4.57 reads
    (families.transformers4_overrides)."""
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

    neuron_config = model_cls.get_neuron_config_cls()(**config["neuron_config"])
    renamed = transformers4_overrides(read_model_config(model_dir))
    if "vision_neuron_config" in config:  # NxDI's image-to-text application (Llama 4), as vLLM's plugin builds it
        vision = model_cls.get_neuron_config_cls()(**config["vision_neuron_config"])
        return model_cls.get_config_cls()(text_neuron_config=neuron_config, vision_neuron_config=vision,
                                          load_config=load_pretrained_config(str(model_dir)), **renamed)
    inference = model_cls.get_config_cls()(neuron_config, load_config=load_pretrained_config(str(model_dir)),
                                           **renamed)
    if "draft" in config:
        from neuronx_distributed_inference.models.config import FusedSpecNeuronConfig

        if draft_dir is None:
            raise BuildError("the recipe speculates but no draft was resolved", where="speculation.draft",
                             fix="set [speculation] draft to a local directory or cached hub id")
        draft_config = model_cls.get_config_cls()(
            _draft_config_object(neuron_config), load_config=load_pretrained_config(str(draft_dir)),
            **transformers4_overrides(read_model_config(draft_dir)))
        inference.fused_spec_config = FusedSpecNeuronConfig(
            model_cls._model_cls, draft_config=draft_config, draft_model_path=str(draft_dir))
    return inference


# --- private ---------------------------------------------------------------------------------------------------------
def _draft_config_object(target):
    """The draft NeuronConfig as upstream builds it: deep copy of the target's object, then attributes set (see
    draft_neuron_config; NeuronConfig(**dict) would flip enable_fused_speculation back on for EAGLE)."""
    draft = copy.deepcopy(target)
    for name, value in draft_neuron_config(vars(target)).items():
        if getattr(draft, name, object()) != value and name in _DRAFT_FIELDS:
            setattr(draft, name, value)
    return draft


_DRAFT_FIELDS = ("speculation_length", "enable_fused_speculation", "modules_to_not_convert", "is_eagle_draft",
                 "sequence_parallel_enabled")


def _shard_weights(model, staging: str, *, image_to_text: bool) -> None:
    """NxDI's own weight sharding of a built model (compile() minus the trace): an image-to-text model shards its
    text and vision weights with their own builders (NeuronBaseForImageToText)."""
    if image_to_text:
        model.shard_text_weights(staging)
        model.shard_vision_weights(staging)
    else:
        model.shard_weights(staging)


def _copy_model_files(request: BuildRequest) -> None:
    """config.json + tokenizer/generation files next to the compiled model (vLLM reads them from --model), and the
    draft's config under draft/ so the artifact alone can be served."""
    from neuronpack.checkpoint import copy_aux_files

    shutil.copy2(Path(request.model_dir) / "config.json", request.staging / "config.json")
    copy_aux_files(Path(request.model_dir), request.staging)
    if request.draft_dir is not None:
        draft_out = request.staging / "draft"
        draft_out.mkdir(exist_ok=True)
        shutil.copy2(Path(request.draft_dir) / "config.json", draft_out / "config.json")
        copy_aux_files(Path(request.draft_dir), draft_out)


def _check_checkpoint(config_dir: Path, hf_config: dict) -> None:
    """Refuse, before any compile, a checkpoint NxDI's converter or config class would refuse (families.py): its
    tensor names from the safetensors headers (no weight is read)."""
    if not hf_config or not (config_dir / "config.json").is_file():
        return
    from neuronpack.checkpoint.reader import open_checkpoint

    try:
        names = open_checkpoint(config_dir).names()
    except CheckpointError:  # an unreadable checkpoint is reported by the key and the build, not here
        names = []
    problem = checkpoint_problem(architecture_of(hf_config), hf_config, names)
    if problem is not None:
        raise UnsupportedModelError(problem[0], where=str(config_dir), fix=problem[1])
