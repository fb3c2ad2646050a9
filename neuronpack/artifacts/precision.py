"""The precision of an artifact's weights, read from its manifest: the one answer ``inspect`` and ``ls`` (local and
remote) show.

Two ways lead to quantized weights, and the manifest records both: the recipe's ``[quantization]`` section (the build
quantized the checkpoint first), or a checkpoint that was already quantized (``neuronpack quantize``, then compile:
the recipe has no section, and the model's config.json, kept in the manifest, has one). Otherwise the weights are
the float dtype the recipe asks for, or the checkpoint's own.

Example::

    weights_precision(read_manifest(path)).describe()   # "int8 per-channel, lm_head included (from the checkpoint)"
    weights_precision(read_manifest(path)).to_dict()["dtype"]   # "int8"
    compute_dtype(read_manifest(path))   # "bfloat16": activations, and the modules kept float
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from neuronpack.artifacts.manifest import Manifest

# config.json sections of quantized checkpoints: neuronpack's own, then Hugging Face's (other toolchains).
_NEURONPACK_SECTION = "quantization"
_HF_SECTIONS = ("quantization_config", "compression_config")


@dataclass(frozen=True)
class WeightsPrecision:
    """``dtype`` of the Linear weights ("int8", "fp8", "bfloat16", ...); for quantized weights their granularity,
    whether lm_head is quantized too and the modules kept float; ``source``: "recipe", "checkpoint" or "float"."""

    dtype: str
    source: str
    granularity: str | None = None
    lm_head_quantized: bool | None = None
    kept_float: tuple[str, ...] = ()

    @property
    def quantized(self) -> bool:
        return self.source != "float"

    def describe(self) -> str:
        """One line for a table cell."""
        if not self.quantized:
            return f"{self.dtype} (not quantized)"
        head = {True: "lm_head included", False: "lm_head float", None: None}[self.lm_head_quantized]
        kept = f"{len(self.kept_float)} module(s) kept float" if self.kept_float else None
        details = ", ".join(x for x in (head, kept, f"from the {self.source}") if x)
        return " ".join(x for x in (self.dtype, self.granularity) if x) + f" ({details})"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kept_float": list(self.kept_float), "quantized": self.quantized,
                "description": self.describe()}


def weights_precision(manifest: Manifest) -> WeightsPrecision:
    """The precision of ``manifest``'s weights: the recipe's quantization, else the checkpoint's, else float."""
    section = manifest.recipe.quantization
    if section is not None:
        return WeightsPrecision(section.dtype, "recipe", section.granularity, section.include_lm_head,
                                tuple(section.skip))
    found = checkpoint_precision(manifest.model.config)
    if found is not None:
        return found
    return WeightsPrecision(compute_dtype(manifest), "float")


def compute_dtype(manifest: Manifest) -> str:
    """The float dtype the model computes in (and keeps unquantized modules in): the recipe's ``model.dtype``, its
    ``auto`` resolved to the checkpoint's ``torch_dtype``."""
    dtype = manifest.recipe.model.dtype
    if dtype == "auto":
        config = manifest.model.config
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "auto")
    return dtype


def checkpoint_precision(config: Mapping[str, Any]) -> WeightsPrecision | None:
    """The precision a checkpoint's config.json declares for its stored weights (neuronpack quantize's section, else
    another toolchain's ``quantization_config`` / ``compression_config``); None for a float checkpoint."""
    own = config.get(_NEURONPACK_SECTION)
    if isinstance(own, Mapping) and own.get("dtype"):
        not_converted = own.get("modules_to_not_convert")
        if isinstance(not_converted, Sequence) and not isinstance(not_converted, str):
            head = "lm_head" not in not_converted
            kept = tuple(str(m) for m in not_converted if m != "lm_head")
        else:
            head, kept = own.get("include_lm_head"), ()
        return WeightsPrecision(str(own["dtype"]), "checkpoint", _text(own.get("granularity")),
                                head if isinstance(head, bool) else None, kept)
    for name in _HF_SECTIONS:
        other = config.get(name)
        if isinstance(other, Mapping) and other:
            method = other.get("quant_method") or other.get("format") or name
            return WeightsPrecision(str(method), "checkpoint")
    return None


def _text(value: Any) -> str | None:
    return str(value) if value else None
