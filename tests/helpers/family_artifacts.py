"""The new families' tiny checkpoints and compiled artifacts, built once per session and shared by every test that
needs one (the ``family_artifact`` fixture in tests/conftest.py): AOTInductor graphs with the tiny serving recipe
(batch 4, seq_len 128, prompts of up to 64 tokens in one call) and prompt-lookup speculation (k = 3), so one
artifact serves the greedy checks, the engine's features and speculation alike.

Example::

    art = family_artifact("qwen3")       # FamilyArtifact(checkpoint=..., path=...)
    lm = load_artifact(art.path)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.helpers.tiny_models import make_tiny_checkpoint

# name -> (arch, tie, extra recipe overrides)
FAMILIES = {
    "qwen3": ("qwen3", False, ()),
    "qwen3-tied": ("qwen3", True, ()),
    "gemma3": ("gemma3", True, ()),  # sliding window 8 (tiny_models.GEMMA3_WINDOW): rings of 8 + 3 positions
}
SPECULATION = ('speculation.kind="prompt_lookup"', "speculation.length=3", "speculation.prompt_lookup_min=1",
               "speculation.prompt_lookup_max=3")


@dataclass(frozen=True)
class FamilyArtifact:
    """The checkpoint, the compiled artifact, and what compiled it: ``build_artifact(checkpoint, out_root,
    overrides)`` (tests/runtime/serving.py)."""

    checkpoint: Path
    path: Path
    out_root: Path
    overrides: tuple[str, ...]


def build_family_artifact(name: str, root: Path) -> FamilyArtifact:
    """Write family ``name``'s tiny checkpoint under ``root`` and compile it (AOTInductor) through the pipeline."""
    from tests.runtime.serving import build_artifact

    arch, tie, extra = FAMILIES[name]
    checkpoint = make_tiny_checkpoint(root / name, arch=arch, tie=tie)
    overrides = ("compiler=aoti", *SPECULATION, *extra)
    out_root = root / f"{name}-root"
    return FamilyArtifact(checkpoint, build_artifact(checkpoint, out_root, list(overrides)), out_root, overrides)
