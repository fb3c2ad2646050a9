"""Recipes: one validated model of a build, loaded from TOML (``recipes/*.toml``) plus ``--set`` overrides.

Every section is optional with sensible defaults, so one recipe builds many checkpoints: MODEL on the command line
stands in for ``[model] source``.

Example::

    recipe = load_recipe(Path("recipes/smollm2-135m-cpu.toml"), overrides=["target.batch_size=4"])
    recipe.target.seq_len   # 1024
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from neuronpack.errors import RecipeError
from neuronpack.recipe_input import parse_set, read_recipe_input
from neuronpack.recipe_methods import RecipeMethods

__all__ = ["Recipe", "load_recipe", "parse_set", "validate_recipe_data"]  # parse_set: for callers of this module

Framework = Literal["auto", "nxd", "tnx", "vneuron", "torch"]
Instance = Literal["trn1", "trn1n", "trn2", "trn3", "inf2", "cpu", "cuda"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    source: str | None = None  # local dir or hub id; MODEL on the command line overrides it
    revision: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


class TargetSection(_Section):
    framework: Framework = "auto"
    instance: Instance | None = None  # None: trn1 for nxd/tnx, cpu for torch
    tp_degree: int = Field(1, ge=1, le=512)
    batch_size: int = Field(1, ge=1, le=1024)
    seq_len: int = Field(2048, ge=1, le=1_048_576)
    max_context_length: int | None = Field(None, ge=1)
    nodes: int = Field(1, ge=1, le=64)  # multi-node NxDI: tp_degree is split evenly across nodes


class BucketsSection(_Section):
    enabled: bool = True
    context: list[int] | Literal["auto"] = "auto"
    token_generation: list[int] | Literal["auto"] = "auto"


class SamplingSection(_Section):
    on_device: bool = True
    dynamic: bool = True
    deterministic: bool = False
    global_topk: int = Field(256, ge=1, le=4096)
    do_sample: bool = False
    top_k: int = Field(1, ge=1)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    temperature: float = Field(1.0, gt=0.0)


class QuantizationSection(_Section):
    dtype: Literal["int8", "fp8"]
    granularity: Literal["per-channel", "per-tensor"] = "per-channel"
    skip: list[str] = []
    include_lm_head: bool = False
    include_experts: bool = False  # MoE experts too: the portable backend only (the nxd backend refuses it)
    kv_cache: bool = False


# vLLM's ngram method: with neither n-gram size given both are 5; with one given the other takes its value
PROMPT_LOOKUP_DEFAULT = 5


class SpeculationSection(_Section):
    """``kind`` "eagle" / "draft" speculate with a draft model (NxD Inference's fused speculation; for eagle the draft
    is converted as ``neuronpack convert-eagle`` does); "prompt_lookup" drafts by n-gram lookup in the prompt and the
    generated text (vLLM's ``ngram`` method, no draft model; the portable backend only)."""

    kind: Literal["eagle", "draft", "prompt_lookup"] = "eagle"
    draft: str | None = None  # local dir or hub id of the draft (eagle, draft); none for prompt_lookup
    length: int = Field(4, ge=1, le=32)  # num_speculative_tokens / speculation_length
    prompt_lookup_max: int | None = Field(None, ge=1, le=64)  # prompt_lookup: longest n-gram matched
    prompt_lookup_min: int | None = Field(None, ge=1, le=64)  # prompt_lookup: shortest n-gram matched

    @model_validator(mode="before")
    @classmethod
    def _lookup_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("kind") != "prompt_lookup":
            return data
        lo, hi = data.get("prompt_lookup_min"), data.get("prompt_lookup_max")
        if lo is None and hi is None:
            lo = hi = PROMPT_LOOKUP_DEFAULT
        return {**data, "prompt_lookup_min": hi if lo is None else lo, "prompt_lookup_max": lo if hi is None else hi}

    @model_validator(mode="after")
    def _kind_fields(self) -> SpeculationSection:
        if self.kind == "prompt_lookup":
            if self.draft is not None:
                raise ValueError('kind "prompt_lookup" uses no draft model: remove speculation.draft')
            if self.prompt_lookup_min > self.prompt_lookup_max:
                raise ValueError(f"prompt_lookup_min {self.prompt_lookup_min} is larger than prompt_lookup_max "
                                 f"{self.prompt_lookup_max}")
            return self
        if self.draft is None:
            raise ValueError(f'kind "{self.kind}" needs a draft model: set speculation.draft to a local directory '
                             "or hub id")
        if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
            raise ValueError(f'prompt_lookup_min / prompt_lookup_max apply to kind "prompt_lookup", not "{self.kind}"')
        return self


class LoraAdapter(_Section):
    name: str = Field(min_length=1, max_length=128)
    path: str = Field(min_length=1)  # a local PEFT adapter directory or a hub id (org/name[@revision])

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        # served as a model name and stored as lora/<name>/ inside the artifact: no path separators
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
            raise ValueError(f"adapter name {value!r} must be letters, digits, '.', '_' or '-' (no '/'), "
                             "starting with a letter or digit")
        return value


# vLLM accepts --max-lora-rank only from this set (LoRAConfig); another rank could be compiled but never served
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


class LoraSection(_Section):
    adapters: list[LoraAdapter] = Field(min_length=1)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    max_rank: int = 16
    max_loras: int = Field(1, ge=1, le=64)

    @field_validator("adapters")
    @classmethod
    def _unique_names(cls, value: list[LoraAdapter]) -> list[LoraAdapter]:
        names = [a.name for a in value]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"adapter name {twice[0]!r} is given twice: names must be unique")
        return value

    @field_validator("max_rank")
    @classmethod
    def _vllm_rank(cls, value: int) -> int:
        if value not in VLLM_LORA_RANKS:
            raise ValueError(f"max_rank {value} is not one vLLM serves: use one of "
                             f"{', '.join(map(str, VLLM_LORA_RANKS))}")
        return value


class VneuronSection(_Section):
    """The SDK 2.31+ vLLM Neuron plugin (framework "vneuron", vllm-neuron 0.21 / 0.24): what vLLM and the plugin start
    with beyond [target]. Each value changes the plugin's compile-cache keys, so the pod starts with the same ones."""

    lnc: Literal[1, 2] = 2  # logical NeuronCore config (NEURON_LOGICAL_NC_CONFIG); trn2 / trn3 default 2
    block_size: int = Field(32, ge=1, le=8192)  # --block-size (paged KV)
    # --num-gpu-blocks-override: CPU compile sizes KV from a fixed HBM table, so the count is pinned here.
    # None: batch_size * ceil(seq_len / block_size), every sequence at full length.
    num_gpu_blocks: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)  # --max-num-batched-tokens; None: max_context_length
    num_seqs_buckets: list[int] | Literal["auto"] = "auto"  # decode batch sizes; auto: powers of 2 to batch_size
    optimization_level: Literal[0, 1, 2, 3] = 2  # vLLM's --optimization-level (-O); 2 is vLLM 0.21's default
    compile_timeout: int = Field(7200, ge=10, le=172_800)  # seconds the CPU compile may take before it is stopped


class Recipe(_Section, RecipeMethods):
    name: str | None = None
    description: str | None = None
    compiler: Literal["aoti", "export"] = "aoti"  # torch backend: AOTInductor, or export-only programs
    model: ModelSection = ModelSection()
    target: TargetSection = TargetSection()
    buckets: BucketsSection = BucketsSection()
    sampling: SamplingSection = SamplingSection()
    quantization: QuantizationSection | None = None
    speculation: SpeculationSection | None = None
    lora: LoraSection | None = None
    vneuron: VneuronSection | None = None
    neuron_overrides: dict[str, Any] = {}

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        t = self.target
        mcl = t.max_context_length or t.seq_len
        if mcl > t.seq_len:
            raise ValueError(f"target.max_context_length {mcl} is larger than target.seq_len {t.seq_len}")
        for key, limit in (("context", mcl), ("token_generation", t.seq_len)):
            values = getattr(self.buckets, key)
            if isinstance(values, list):
                if not values:
                    raise ValueError(f'buckets.{key} is empty; give lengths or "auto"')
                if max(values) > limit:
                    raise ValueError(f"buckets.{key} has {max(values)}, larger than its maximum {limit}")
                if min(values) < 1:
                    raise ValueError(f"buckets.{key} has {min(values)}; buckets must be positive")
        if t.tp_degree % t.nodes:
            raise ValueError(f"target.tp_degree {t.tp_degree} is not divisible by target.nodes {t.nodes}")
        if self.speculation is not None and self.lora is not None:
            raise ValueError("speculation and lora cannot be combined (vLLM on Neuron does not support both)")
        if self.speculation is not None and self.speculation.length >= t.seq_len:
            raise ValueError(f"speculation.length {self.speculation.length} must be below target.seq_len")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _explain(exc: ValidationError, where: str) -> RecipeError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        what = f"unknown key {loc!r}"
        fix = "remove it or check the spelling against docs/recipes.md"
    elif err["type"] == "missing":
        what = f"missing required key {loc!r}"
        fix = "add it (see docs/recipes.md)"
    else:
        msg = err["msg"].removeprefix("Value error, ")
        what = f"{loc}: {msg}" if loc else msg
        given = err.get("input")
        if loc and not isinstance(given, dict | list) and given is not None:
            what += f" (got {given!r})"
        fix = "fix the value (see docs/recipes.md)"
    return RecipeError(what, where=where, fix=fix)


def validate_recipe_data(data: dict[str, Any], where: str) -> Recipe:
    """A Recipe from ``read_recipe_input`` data; RecipeError naming ``where`` and the first bad key."""
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc, where) from None


def load_recipe(path: Path | None = None, *, overrides: Sequence[str] = (), model: str | None = None) -> Recipe:
    """Load and validate a recipe. ``overrides`` are ``--set key.path=value`` strings; ``model`` replaces the
    recipe's model source. Any problem raises RecipeError naming the file and key."""
    return validate_recipe_data(*read_recipe_input(path, overrides=overrides, model=model))
