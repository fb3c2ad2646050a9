"""The transformers-neuronx backend (the fallback when NxD Inference is not installed).

Written against transformers-neuronx 0.13's documented API (``from_pretrained(..., n_positions,
context_length_estimate, neuron_config)``, ``to_neuron()``, ``save(dir)``) and vLLM 0.9's TNx loader
(``vllm/model_executor/model_loader/neuron.py``); proven by contract tests with a stand-in SDK, never run on Neuron
hardware here.

Buckets: ``context_length_estimate`` = the context-encoding buckets, ``n_positions`` = the token-generation buckets
(vLLM reads the same lists from NEURON_CONTEXT_LENGTH_BUCKETS / NEURON_TOKEN_GEN_BUCKETS). TNx quantizes weights
itself at load time (QuantizationConfig s8 / f8e4m3fn), so it is given the unquantized checkpoint.

Artifact: ``neffs/<hlo hash>.neff`` (TNx ``save``), ``tnx_config.json`` (what was compiled), config.json and the
tokenizer files. vLLM 0.9's TNx path always compiles at start-up (it does not read NEURON_COMPILED_ARTIFACTS); the
saved NEFFs load through TNx's own ``model.load(dir)`` before ``to_neuron()``.

Example::

    TnxBackend().compile_config(request)["from_pretrained"]["n_positions"]   # [512, 2048]
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.backends.base import Availability, BuildRequest
from neuronpack.backends.neuron.common import import_class, model_dtype, neuron_instance, read_model_config
from neuronpack.backends.neuron.packages import neuron_devices, sdk_availability, versions_of
from neuronpack.errors import ArtifactError, BuildError, UnsupportedModelError

if TYPE_CHECKING:  # annotations only: a cache hit (target, versions) imports no pydantic
    from neuronpack.artifacts.manifest import Manifest
    from neuronpack.recipe import Recipe

TNX_DISTS = ("transformers-neuronx", "neuronx-cc", "torch-neuronx")
# HF architecture -> TNx sampling class, as vLLM 0.9 maps them
MODEL_CLASSES = {
    "LlamaForCausalLM": "transformers_neuronx.llama.model.LlamaForSampling",
    "MistralForCausalLM": "transformers_neuronx.mistral.model.MistralForSampling",
}
AMP = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}  # vLLM's TORCH_DTYPE_TO_NEURON_AMP
QUANT_DTYPES = {"int8": "s8", "fp8": "f8e4m3fn"}  # TNx QuantizationConfig.quant_dtype / vLLM NEURON_QUANT_DTYPE
NEFF_DIR = "neffs"
CONFIG_NAME = "tnx_config.json"


class TnxBackend:
    """Backend protocol implementation for transformers-neuronx. See the module docstring."""

    name = "tnx"
    quantizes_on_load = True
    checks_accuracy_before_compile = False
    graph_key_ignores = ()

    def availability(self) -> Availability:
        return sdk_availability("transformers_neuronx")

    def versions(self) -> dict[str, str]:
        return versions_of(TNX_DISTS)

    def target(self, recipe: Recipe) -> dict[str, Any]:
        instance = neuron_instance(recipe, "tnx")
        return {"instance": instance, "platform_target": instance}

    def compile_config(self, request: BuildRequest) -> dict[str, Any]:
        recipe, plan = request.recipe, request.plan
        hf_config = read_model_config(request.model_dir)
        if recipe.speculation is not None or recipe.lora is not None:
            raise UnsupportedModelError(
                "the transformers-neuronx backend builds plain models only (no speculation or LoRA)",
                where="recipe", fix="use --framework nxd for speculation and LoRA")
        if isinstance(hf_config.get("quantization"), dict):
            raise UnsupportedModelError(
                "transformers-neuronx quantizes at load time and cannot read a pre-quantized checkpoint",
                where=str(request.model_dir), fix="give it the unquantized checkpoint (recipe [quantization] only "
                                                  "sets QuantizationConfig for TNx)")
        amp = AMP[model_dtype(recipe, hf_config)]
        return {
            "architecture": _architecture(hf_config),
            "model_class": _model_class(hf_config, where=str(request.model_dir)),
            "platform_target": neuron_instance(recipe, "tnx"),
            "from_pretrained": {
                "tp_degree": recipe.target.tp_degree,
                "amp": amp,
                "batch_size": recipe.target.batch_size,
                "n_positions": list(plan.token_generation),
                "context_length_estimate": list(plan.context),
            },
            "neuron_config": tnx_neuron_config(recipe, amp),
        }

    def build(self, request: BuildRequest) -> dict[str, Any]:
        availability = self.availability()
        if not availability.ok:
            raise BuildError(f"transformers-neuronx cannot build here: {availability.reason}", where="framework tnx",
                             fix="compile on a machine with the Neuron SDK, or use --dry-run / --framework torch")
        config = self.compile_config(request)
        if request.donor is not None:  # TNx's NEFFs take the weights as inputs at to_neuron(): the donor's serve
            return self._package(request, config, {"model_class": config["model_class"]})
        os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = config["platform_target"]
        model_cls = import_class(config["model_class"])
        with request.reporter.task(f"transformers-neuronx compile ({config['architecture']})"):
            model = model_cls.from_pretrained(str(request.model_dir), neuron_config=_neuron_config(config),
                                              **config["from_pretrained"])
            # to_neuron() loads onto devices; a build box without them compiles on CPU
            how = "to_neuron" if neuron_devices() or not hasattr(model, "cpu_compile") else "cpu_compile"
            getattr(model, how)()
            (request.staging / NEFF_DIR).mkdir()
            model.save(str(request.staging / NEFF_DIR))
        return self._package(request, config, {"model_class": config["model_class"], "compiled_with": how})

    def _package(self, request: BuildRequest, config: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        check_tnx_artifact(request.staging)
        (request.staging / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        _copy_model_files(request)
        return {"tnx": info}

    def graph_files(self, paths) -> list[str]:
        # neffs/<hlo hash>.neff, what TNx's save() writes and load() + to_neuron() match by HLO: weights are the
        # NEFFs' inputs (transformers_neuronx/base.py), read from the checkpoint at start-up
        return [p for p in paths if p.startswith(f"{NEFF_DIR}/")]

    def graph_reuse_problem(self) -> str | None:
        return None

    def validate_artifact(self, artifact_dir: Path, manifest: Manifest) -> None:
        check_tnx_artifact(Path(artifact_dir))
        built, here = manifest.versions, self.versions()
        for dist in TNX_DISTS:
            if dist in built and built[dist] != here.get(dist):
                raise ArtifactError(f"built with {dist} {built[dist]}, this machine has {here.get(dist)}",
                                    where=str(artifact_dir), fix=f"install {dist}=={built[dist]} or rebuild here")


def tnx_neuron_config(recipe: Recipe, amp: str) -> dict:
    """transformers_neuronx.config.NeuronConfig kwargs (nested configs as dicts), vLLM 0.9's defaults first, then
    the recipe, then ``neuron_overrides`` (shallow).

    Example::

        tnx_neuron_config(recipe, "bf16")["continuous_batching"]   # {"max_num_seqs": 2}
    """
    cfg: dict[str, Any] = {
        "collectives_layout": "BSH",
        "attention_layout": "BSH",
        "fuse_qkv": True,
        "continuous_batching": {"max_num_seqs": recipe.target.batch_size, "max_model_len": recipe.target.seq_len},
        "padding_side": "right",
    }
    if recipe.quantization is not None:
        q = recipe.quantization
        cfg["quant"] = {"quant_dtype": QUANT_DTYPES[q.dtype], "dequant_dtype": amp, "quantize_method": "vector_dynamic"}
        cfg["weight_tiling"] = True
    s = recipe.sampling
    if s.on_device:
        cfg["on_device_generation"] = {
            "max_length": recipe.target.seq_len, "do_sample": s.do_sample, "top_k": s.top_k, "top_p": s.top_p,
            "temperature": s.temperature, "global_top_k": s.global_topk, "dynamic": s.dynamic,
            "deterministic": s.deterministic, "per_batch_line": s.dynamic,
        }
    cfg.update(recipe.neuron_overrides)
    return cfg


def check_tnx_artifact(artifact_dir: Path) -> None:
    neffs = artifact_dir / NEFF_DIR
    if not neffs.is_dir() or not any(neffs.glob("*.neff")):
        raise ArtifactError("transformers-neuronx artifact has no compiled NEFFs", where=str(neffs),
                            fix="rebuild it with `neuronpack compile --force`")


# --- private ---------------------------------------------------------------------------------------------------------
def _architecture(hf_config: dict) -> str | None:
    archs = hf_config.get("architectures") or []
    return next((a for a in archs if a in MODEL_CLASSES), archs[0] if archs else None)


def _model_class(hf_config: dict, *, where: str) -> str:
    arch = _architecture(hf_config)
    if arch not in MODEL_CLASSES:
        raise UnsupportedModelError(f"transformers-neuronx backend has no class for architecture {arch!r}",
                                    where=where, fix=f"supported: {', '.join(MODEL_CLASSES)}; or use --framework nxd")
    return MODEL_CLASSES[arch]


def _neuron_config(config: dict):
    """Build the real TNx config objects from the JSON-able dict (vLLM's _get_neuron_config_after_override)."""
    from transformers_neuronx.config import ContinuousBatchingConfig, GenerationConfig, NeuronConfig, QuantizationConfig

    kwargs = dict(config["neuron_config"])
    kwargs["continuous_batching"] = ContinuousBatchingConfig(**kwargs["continuous_batching"])
    if "quant" in kwargs:
        kwargs["quant"] = QuantizationConfig(**kwargs["quant"])
    if "on_device_generation" in kwargs:
        kwargs["on_device_generation"] = GenerationConfig(**kwargs["on_device_generation"])
    return NeuronConfig(**kwargs)


def _copy_model_files(request: BuildRequest) -> None:
    from neuronpack.checkpoint import copy_aux_files

    shutil.copy2(Path(request.model_dir) / "config.json", request.staging / "config.json")
    copy_aux_files(Path(request.model_dir), request.staging)
