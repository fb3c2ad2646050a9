"""Derived checkpoints a build needs, each cached by content next to the artifacts: the offline-quantized model
(recipe [quantization]) and the EAGLE draft with the target's head added (recipe [speculation] kind = "eagle")."""

from __future__ import annotations

from pathlib import Path

from neuronpack.artifacts.key import model_identity
from neuronpack.digest import sha256_json
from neuronpack.progress import Reporter
from neuronpack.recipe import QuantizationSection

EAGLE_MANIFEST = "neuronpack-eagle.json"


def quantize_options(section: QuantizationSection):
    from neuronpack.convert.quantize import QuantizeOptions

    return QuantizeOptions(
        dtype=section.dtype,
        granularity=section.granularity,
        skip=tuple(section.skip),
        include_lm_head=section.include_lm_head,
    )


def quantized_model_path(cache_root: Path, model_dir: Path, section: QuantizationSection) -> Path:
    """Where the quantized checkpoint for these inputs lives (it may not exist yet)."""
    from neuronpack.convert.quantize import quantized_checkpoint_path

    return quantized_checkpoint_path(cache_root, model_dir, quantize_options(section))


def ensure_quantized(cache_root: Path, model_dir: Path, section: QuantizationSection, reporter: Reporter) -> Path:
    """Quantize once; later builds reuse the cached checkpoint."""
    from neuronpack.convert.quantize import quantize_checkpoint

    out = quantized_model_path(cache_root, model_dir, section)
    result = quantize_checkpoint(model_dir, out, quantize_options(section), reporter=reporter)
    reporter.info(f"quantized checkpoint: {result.out}{' (cache hit)' if result.cache_hit else ''}")
    return Path(result.out)


def converted_draft_path(cache_root: Path, draft_dir: Path, target_dir: Path) -> Path:
    if (draft_dir / EAGLE_MANIFEST).is_file():
        return draft_dir
    key = sha256_json({"draft": model_identity(draft_dir), "target": model_identity(target_dir)})
    return cache_root / "eagle-drafts" / key


def ensure_eagle_draft(cache_root: Path, draft_dir: Path, target_dir: Path, reporter: Reporter) -> Path:
    """An EAGLE draft as NxD Inference needs it (target LM head inside); converted once and cached."""
    out = converted_draft_path(cache_root, draft_dir, target_dir)
    if out == draft_dir or (out / EAGLE_MANIFEST).is_file():
        return out
    from neuronpack.convert.eagle import convert_eagle

    convert_eagle(draft_dir, target_dir, out, reporter=reporter)
    reporter.info(f"converted EAGLE draft: {out}")
    return out
