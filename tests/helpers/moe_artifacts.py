"""The MoE families' tiny checkpoints (tests/helpers/tiny_moe.py, written by transformers) compiled once per session
and shared by every test that needs one (the ``family_artifact`` fixture in tests/conftest.py): AOTInductor graphs
calling neuronpack's kernels (the routed experts among them), the tiny serving recipe (batch 4, seq_len 128, prompts
up to 64 tokens in one call) and prompt-lookup speculation (k = 3), as tests/helpers/family_artifacts.py builds the
dense families'.

Example::

    art = family_artifact("gpt_oss-mxfp4")       # FamilyArtifact(checkpoint=..., path=...)
    lm = load_artifact(art.path)
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.family_artifacts import SPECULATION, FamilyArtifact
from tests.helpers.tiny_moe import make_tiny_moe_checkpoint

# name -> (family, checkpoint layout)
MOE_ARTIFACTS = {
    "qwen3_moe": ("qwen3_moe", "per_expert"),
    "mixtral": ("mixtral", "fused"),
    "gpt_oss": ("gpt_oss", "per_expert"),  # transformers' layout: fused, transposed, gate / up interleaved
    "gpt_oss-mxfp4": ("gpt_oss", "mxfp4"),
}


def build_moe_artifact(name: str, root: Path) -> FamilyArtifact:
    """Write ``name``'s tiny checkpoint under ``root`` and compile it (AOTInductor) through the pipeline."""
    from tests.runtime.serving import build_artifact

    family, layout = MOE_ARTIFACTS[name]
    checkpoint = make_tiny_moe_checkpoint(root / name, family, layout=layout)
    overrides, out_root = ("compiler=aoti", *SPECULATION), root / f"{name}-root"
    return FamilyArtifact(checkpoint, build_artifact(checkpoint, out_root, list(overrides)), out_root, overrides)
