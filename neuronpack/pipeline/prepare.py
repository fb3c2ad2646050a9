"""Derived checkpoints a build needs, each cached by content next to the artifacts: the offline-quantized model
(recipe [quantization]) and the EAGLE draft with the target's head added (recipe [speculation] kind = "eagle").

The ``*_path`` functions say where a derived checkpoint lives (the build plan records it, also for --dry-run); the
``ensure_*`` functions make it there once."""

from __future__ import annotations

from pathlib import Path

from neuronpack.artifacts.key import model_identity
from neuronpack.convert.eagle import MANIFEST as EAGLE_MANIFEST
from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint, quantized_checkpoint_path
from neuronpack.digest import sha256_json
from neuronpack.progress import Reporter
from neuronpack.recipe import QuantizationSection


def quantized_model_path(cache_root: Path, model_dir: Path, section: QuantizationSection) -> Path:
    """Where the quantized checkpoint for these inputs lives (it may not exist yet)."""
    return quantized_checkpoint_path(cache_root, model_dir, QuantizeOptions.from_recipe(section))


def ensure_quantized(out: Path, model_dir: Path, section: QuantizationSection, reporter: Reporter) -> Path:
    """Quantize into ``out`` (a ``quantized_model_path``) once; later builds reuse the cached checkpoint."""
    result = quantize_checkpoint(model_dir, out, QuantizeOptions.from_recipe(section), reporter=reporter)
    reporter.info(f"quantized checkpoint: {result.out}{' (cache hit)' if result.cache_hit else ''}")
    return Path(result.out)


def converted_draft_path(cache_root: Path, draft_dir: Path, target_dir: Path) -> Path:
    """Where the EAGLE draft converted for this target lives; the draft itself when it is converted already."""
    if (draft_dir / EAGLE_MANIFEST).is_file():
        return draft_dir
    key = sha256_json({"draft": model_identity(draft_dir), "target": model_identity(target_dir)})
    return cache_root / "eagle-drafts" / key


def ensure_eagle_draft(out: Path, draft_dir: Path, target_dir: Path, reporter: Reporter) -> Path:
    """An EAGLE draft as NxD Inference needs it (target LM head inside), converted into ``out`` (a
    ``converted_draft_path``) once and cached."""
    if out == draft_dir or (out / EAGLE_MANIFEST).is_file():
        return out
    from neuronpack.convert.eagle import convert_eagle

    convert_eagle(draft_dir, target_dir, out, reporter=reporter)
    reporter.info(f"converted EAGLE draft: {out}")
    return out
