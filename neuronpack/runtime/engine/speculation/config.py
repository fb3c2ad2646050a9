"""What an artifact speculates with, as its ``neuron_config.json`` records it (``speculation``), and the proposer
that implements it. Torch-free (building an EAGLE proposer imports torch).

Example::

    config = SpeculationConfig.from_dict({"kind": "prompt_lookup", "length": 4, "prompt_lookup_min": 2,
                                          "prompt_lookup_max": 4})
    config.proposer()          # PromptLookupProposer(min_n=2, max_n=4)
    SpeculationConfig.from_dict({"kind": "eagle", "length": 4, "draft": "draft"}, artifact).draft_dir  # artifact/draft
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuronpack.runtime.engine.speculation.proposer import PromptLookupProposer, Proposer


@dataclass(frozen=True)
class SpeculationConfig:
    """``draft_dir``: the artifact's EAGLE draft (kind "eagle"), loaded in ``draft_dtype``."""

    kind: str
    length: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    draft_dir: Path | None = None
    draft_dtype: str = "float32"

    @classmethod
    def from_dict(cls, data: dict[str, Any], artifact_dir: Path | None = None) -> SpeculationConfig:
        """``data``: neuron_config.json's ``speculation``; a recorded ``draft`` is relative to ``artifact_dir``."""
        draft = data.get("draft")
        return cls(kind=str(data["kind"]), length=int(data["length"]), prompt_lookup_min=data.get("prompt_lookup_min"),
                   prompt_lookup_max=data.get("prompt_lookup_max"),
                   draft_dir=Path(artifact_dir or ".") / draft if draft else None,
                   draft_dtype=str(data.get("draft_dtype") or "float32"))

    def proposer(self, model: Any = None) -> Proposer:
        """The drafting side for this kind (an EAGLE draft is loaded here: torch). ``model``: the target
        (``CompiledLM``): an EAGLE draft needs its layer count and runs its compiled draft graphs when it has any."""
        if self.kind == "prompt_lookup":
            return PromptLookupProposer(int(self.prompt_lookup_min or 1), int(self.prompt_lookup_max or 1))
        if self.kind == "eagle" and self.draft_dir is not None:
            import torch

            from neuronpack.models.eagle import load_eagle_draft
            from neuronpack.runtime.engine.speculation.eagle import EagleProposer

            draft = load_eagle_draft(self.draft_dir, getattr(torch, self.draft_dtype),
                                     target_layers=getattr(model, "num_layers", None))
            graphs = model.draft_graphs(draft) if hasattr(model, "draft_graphs") else None
            return EagleProposer(draft, graphs, rows=getattr(model, "batch_size", 1))
        raise ValueError(f"speculation kind {self.kind!r} is not implemented by the portable runtime")
