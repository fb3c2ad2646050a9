"""What an artifact speculates with, as its ``neuron_config.json`` records it (``speculation``), and the proposer
that implements it. Torch-free.

Example::

    config = SpeculationConfig.from_dict({"kind": "prompt_lookup", "length": 4, "prompt_lookup_min": 2,
                                          "prompt_lookup_max": 4})
    config.proposer()          # PromptLookupProposer(min_n=2, max_n=4)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neuronpack.runtime.speculation.proposer import PromptLookupProposer, Proposer


@dataclass(frozen=True)
class SpeculationConfig:
    kind: str
    length: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeculationConfig:
        return cls(kind=str(data["kind"]), length=int(data["length"]), prompt_lookup_min=data.get("prompt_lookup_min"),
                   prompt_lookup_max=data.get("prompt_lookup_max"))

    def proposer(self) -> Proposer:
        """The drafting side for this kind (EAGLE drafts will plug in here)."""
        if self.kind == "prompt_lookup":
            return PromptLookupProposer(int(self.prompt_lookup_min or 1), int(self.prompt_lookup_max or 1))
        raise ValueError(f"speculation kind {self.kind!r} is not implemented by the portable runtime")
