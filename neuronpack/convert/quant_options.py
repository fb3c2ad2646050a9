"""What to quantize and how: ``QuantizeOptions``, from the command line or a recipe's ``[quantization]`` section.

Its own module so the quantizer's stages (quant_plan, quant_stream) and the pipeline share it without importing
quantize.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neuronpack.errors import QuantizationError

DTYPES = ("int8", "fp8")
GRANULARITIES = ("per-channel", "per-tensor")


@dataclass(frozen=True)
class QuantizeOptions:
    """What to quantize and how. Invalid values raise QuantizationError (one line, exit 1 in the CLI).

    Example::

        QuantizeOptions(dtype="fp8", granularity="per-tensor", skip=("*.down_proj",), include_lm_head=True)
    """

    dtype: str
    granularity: str = "per-channel"
    skip: tuple[str, ...] = ()
    include_lm_head: bool = False
    include_experts: bool = False  # MoE experts too (the portable backend only: NxD Inference keeps them float)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise QuantizationError(f"unknown quantization dtype {self.dtype!r}", where="--dtype",
                                    fix=f"choose one of {', '.join(DTYPES)}")
        if self.granularity not in GRANULARITIES:
            raise QuantizationError(f"unknown granularity {self.granularity!r}", where="--granularity",
                                    fix=f"choose one of {', '.join(GRANULARITIES)}")
        skip = tuple(dict.fromkeys(str(s).strip() for s in self.skip if str(s).strip()))
        object.__setattr__(self, "skip", skip)

    @classmethod
    def from_recipe(cls, section: Any) -> QuantizeOptions:
        """From a recipe's ``[quantization]`` section (dtype, granularity, skip, include_lm_head, include_experts)."""
        return cls(dtype=section.dtype, granularity=section.granularity, skip=tuple(section.skip),
                   include_lm_head=bool(getattr(section, "include_lm_head", False)),
                   include_experts=bool(getattr(section, "include_experts", False)))

    @classmethod
    def from_checkpoint_config(cls, config: Any) -> QuantizeOptions | None:
        """From the ``quantization`` section ``neuronpack quantize`` writes into a checkpoint's config.json
        (convert/quant_stream.py); None for a checkpoint without one."""
        section = config.get("quantization") if isinstance(config, dict) else None
        if not isinstance(section, dict) or not section.get("dtype"):
            return None
        return cls(str(section["dtype"]), str(section.get("granularity") or "per-channel"),
                   include_lm_head=bool(section.get("include_lm_head")),
                   include_experts=bool(section.get("include_experts")))

    def as_dict(self) -> dict[str, Any]:
        out = {"dtype": self.dtype, "granularity": self.granularity, "skip": list(self.skip),
               "include_lm_head": self.include_lm_head}
        if self.include_experts:  # only when set: the keys of earlier quantizations stay as they were
            out["include_experts"] = True
        return out
