"""The recipe -> what the SDK 2.31+ vLLM Neuron plugin starts with (torch-free, no SDK import).

One ``PluginConfig`` drives the CPU compile on the build box and ``vllm serve`` on the pod, so the two starts cannot
differ in anything that changes a compile-cache key (``create_cache_hash`` in vllm_neuron/compile/cache.py hashes
the captured FX graph, input shapes and the compiler's target, and the graphs follow from these values):

- vLLM's own flags: ``--tensor-parallel-size``, ``--max-num-seqs``, ``--max-model-len``,
  ``--max-num-batched-tokens``, ``--block-size``, ``--num-gpu-blocks-override`` (CPU compile sizes KV from a fixed
  HBM table, vllm_neuron/compile/platform.py, so the pod must get the same count), ``--dtype``,
  ``--optimization-level`` (vLLM 0.21's arg_utils.py);
- ``--additional-config {"neuron_config": {...}}`` (read by the worker, vllm_neuron/vllm/worker/neuron_worker.py):
  ``num_batched_tokens_buckets`` (prefill token counts, from [buckets] context), ``num_seqs_buckets`` (decode batch
  sizes, [vneuron] num_seqs_buckets), ``decode_context_length_buckets`` ([buckets] token_generation when listed),
  and what ``[neuron_overrides]`` sets among the keys the plugin reads (on-device sampling, quantization, dp / ep);
- environment: ``NEURON_PLATFORM_TARGET_OVERRIDE`` (``resolve_target()`` reads it first, so build box and pod hash
  the same ``--target``) and ``NEURON_LOGICAL_NC_CONFIG`` (LNC).

Example::

    config = plugin_config(recipe, {"torch_dtype": "bfloat16"})
    config.vllm_flags()   # ["--tensor-parallel-size", "32", ..., "--additional-config", '{"neuron_config": ...}']
    config.env            # {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", "NEURON_LOGICAL_NC_CONFIG": "2"}
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from neuronpack.backends.neuron.common import model_dtype
from neuronpack.errors import RecipeError

if TYPE_CHECKING:
    from neuronpack.recipe import Recipe

# the targets the plugin's CPU compile accepts (HBM_MEMORY_GB in vllm_neuron/compile/platform.py)
VNEURON_INSTANCES = ("trn1", "trn1n", "trn2", "trn3", "inf2")
DEFAULT_LNC = 2  # VneuronSection.lnc's default, for a recipe without a [vneuron] section
MIN_TOKENS_BUCKET = 128  # the plugin's default prefill buckets start here (powers of 2 up to max_num_batched_tokens)
# neuron_config keys made from [buckets] / [vneuron]: set them there, not in [neuron_overrides]
DERIVED_KEYS = ("num_batched_tokens_buckets", "num_seqs_buckets", "decode_context_length_buckets")
# neuron_config keys the 0.21 worker reads (neuron_worker.py: on_device_sampling_config, ep_degree, the dp sizes) or
# the plugin's configuration reference documents (kv_segment_size_buckets, quantization)
OVERRIDE_KEYS = ("kv_segment_size_buckets", "on_device_sampling_config", "quantization", "ep_degree",
                 "attention_dp_size", "embedding_dp_size", "lm_head_dp_size", "mlp_dp_size")


@dataclass(frozen=True)
class PluginConfig:
    """Everything both starts of the plugin share; JSON-able through ``to_dict`` (the manifest's compile_config)."""

    instance: str
    lnc: int
    tensor_parallel_size: int
    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int
    block_size: int
    num_gpu_blocks: int
    dtype: str
    optimization_level: int
    neuron_config: dict[str, Any]
    compile_timeout: int

    @property
    def env(self) -> dict[str, str]:
        return {"NEURON_PLATFORM_TARGET_OVERRIDE": self.instance, "NEURON_LOGICAL_NC_CONFIG": str(self.lnc)}

    def vllm_flags(self) -> list[str]:
        """vLLM's flags after ``--model`` (the same on the build box and the pod)."""
        return ["--tensor-parallel-size", str(self.tensor_parallel_size), "--max-num-seqs", str(self.max_num_seqs),
                "--max-model-len", str(self.max_model_len), "--max-num-batched-tokens",
                str(self.max_num_batched_tokens), "--block-size", str(self.block_size),
                "--num-gpu-blocks-override", str(self.num_gpu_blocks), "--dtype", self.dtype,
                "--optimization-level", str(self.optimization_level),
                "--additional-config", json.dumps({"neuron_config": self.neuron_config}, sort_keys=True)]

    def to_dict(self) -> dict[str, Any]:
        """Every field, plus what both starts derive from them (``env``, ``vllm_flags``) for the manifest."""
        return {**dataclasses.asdict(self), "env": self.env, "vllm_flags": self.vllm_flags()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PluginConfig:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


def vneuron_instance(recipe: Recipe) -> str:
    """The recipe's instance for the plugin; RecipeError when the plugin's CPU compile cannot target it."""
    instance = recipe.instance_for("vneuron")
    if instance not in VNEURON_INSTANCES:
        raise RecipeError(f"target.instance {instance!r} is not a target of the vLLM Neuron plugin",
                          where="target.instance", fix=f"use one of {', '.join(VNEURON_INSTANCES)} (trn2 / trn3 for "
                                                      "the SDK 2.31+ plugin), or another --framework")
    return instance


def recipe_lnc(recipe: Recipe) -> int:
    section = recipe.vneuron
    return int(section.lnc) if section is not None else DEFAULT_LNC


def plugin_config(recipe: Recipe, hf_config: dict) -> PluginConfig:
    """The plugin's configuration for a validated recipe (RecipeError naming the key it cannot map)."""
    instance = vneuron_instance(recipe)
    _refuse_unmapped(recipe)
    from neuronpack.recipe import VneuronSection  # a build path: the full recipe is validated already

    section = recipe.vneuron or VneuronSection()
    target = recipe.target
    max_tokens = section.max_num_batched_tokens or recipe.max_context_length
    blocks = section.num_gpu_blocks or target.batch_size * math.ceil(target.seq_len / section.block_size)
    neuron_config: dict[str, Any] = {
        "num_batched_tokens_buckets": _token_buckets(recipe, max_tokens),
        "num_seqs_buckets": _seqs_buckets(section.num_seqs_buckets, target.batch_size),
    }
    if recipe.buckets.enabled and isinstance(recipe.buckets.token_generation, list):
        neuron_config["decode_context_length_buckets"] = sorted(set(recipe.buckets.token_generation))
    neuron_config.update(recipe.neuron_overrides)
    return PluginConfig(instance=instance, lnc=int(section.lnc), tensor_parallel_size=target.tp_degree,
                        max_num_seqs=target.batch_size, max_model_len=target.seq_len,
                        max_num_batched_tokens=max_tokens, block_size=section.block_size, num_gpu_blocks=blocks,
                        dtype=model_dtype(recipe, hf_config), optimization_level=int(section.optimization_level),
                        neuron_config=dict(sorted(neuron_config.items())), compile_timeout=section.compile_timeout)


# --- private ---------------------------------------------------------------------------------------------------------
def _refuse_unmapped(recipe: Recipe) -> None:
    """What the plugin path cannot honour is refused by name, not dropped."""
    unsupported = {"speculation": "the plugin's CPU compile does not support speculative decoding",
                   "lora": "neuronpack does not map LoRA to the plugin yet",
                   "quantization": "the plugin quantizes through its own neuron_config 'quantization' key, not NxD "
                                   "Inference's offline checkpoint format"}
    for name, why in unsupported.items():
        if getattr(recipe, name) is not None:
            fix = ("set neuron_overrides.quantization as the plugin documents it" if name == "quantization"
                   else f"remove [{name}] or use --framework nxd")
            raise RecipeError(f"[{name}] cannot be built for the vLLM Neuron plugin: {why}", where=f"[{name}]", fix=fix)
    if recipe.target.nodes != 1:
        raise RecipeError("the vLLM Neuron plugin path builds one node", where="target.nodes", fix="set it to 1")
    for key in recipe.neuron_overrides:
        if key in DERIVED_KEYS:
            raise RecipeError(f"neuron_overrides.{key} is made from the recipe's buckets",
                              where=f"neuron_overrides.{key}",
                              fix="set [buckets] context / token_generation or [vneuron] num_seqs_buckets instead")
        if key not in OVERRIDE_KEYS:
            raise RecipeError(f"neuron_overrides.{key} is not a neuron_config key the vLLM Neuron plugin reads",
                              where=f"neuron_overrides.{key}", fix=f"use one of {', '.join(OVERRIDE_KEYS)}")


def _token_buckets(recipe: Recipe, max_tokens: int) -> list[int]:
    context = recipe.buckets.context
    if not recipe.buckets.enabled:
        return [max_tokens]
    if isinstance(context, list):
        if max(context) > max_tokens:
            raise RecipeError(f"buckets.context has {max(context)}, above max_num_batched_tokens {max_tokens}",
                              where="buckets.context", fix="lower the bucket or raise [vneuron] max_num_batched_tokens")
        return sorted(set(context) | {max_tokens})  # the plugin requires the largest to equal max_num_batched_tokens
    return _powers_of_two(MIN_TOKENS_BUCKET, max_tokens)


def _seqs_buckets(values: list[int] | str, max_num_seqs: int) -> list[int]:
    if values == "auto":
        return _powers_of_two(1, max_num_seqs)
    if max(values) > max_num_seqs or min(values) < 1:
        raise RecipeError(f"vneuron.num_seqs_buckets {values} must lie in 1..{max_num_seqs} (target.batch_size)",
                          where="vneuron.num_seqs_buckets", fix="fix the list or target.batch_size")
    return sorted(set(values) | {max_num_seqs})  # the largest must equal max_num_seqs


def _powers_of_two(low: int, high: int) -> list[int]:
    values, size = [], low
    while size < high:
        values.append(size)
        size *= 2
    return [*values, high]
