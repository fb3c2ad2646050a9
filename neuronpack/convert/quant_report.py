"""The quantization report: per-tensor and whole-model error, written as ``quantization_report.json``.

Relative error is ``||W - deq(Q)||_F / ||W||_F``; SNR is ``10 log10(||W||^2 / ||W - deq(Q)||^2)`` dB (``null`` when
the quantization is exact). The whole-model figures pool every quantized tensor's sums, so large matrices weigh more.

Example::

    report = build_report(stats, options_dict, modules_to_not_convert=["lm_head"], kept=["lm_head"])
    report["model"]["snr_db"]          # e.g. 38.2
    summarize(report)["worst_tensor"]  # the tensor with the largest relative error
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

REPORT_FILE = "quantization_report.json"


class _Stats(Protocol):
    signal: float
    noise: float

    @property
    def relative_error(self) -> float: ...

    @property
    def snr_db(self) -> float | None: ...


def tensor_entry(name: str, shape: Sequence[int], source_dtype: str, stats: _Stats) -> dict[str, Any]:
    """One row of the report, e.g. ``{"name": ..., "relative_error": 0.0041, "snr_db": 47.7, ...}``."""
    return {
        "name": name,
        "shape": list(shape),
        "source_dtype": source_dtype,
        "relative_error": stats.relative_error,
        "snr_db": stats.snr_db,
    }


def build_report(
    tensors: Sequence[dict[str, Any]],
    model_stats: _Stats,
    options: Mapping[str, Any],
    *,
    modules_to_not_convert: Sequence[str],
    kept_tensors: Sequence[str],
    input_bytes: int,
    output_bytes: int,
) -> dict[str, Any]:
    """Assemble the JSON report from the per-tensor rows and the pooled model statistics."""
    return {
        "options": dict(options),
        "model": {
            "relative_error": model_stats.relative_error,
            "snr_db": model_stats.snr_db,
            "quantized_tensors": len(tensors),
            "kept_tensors": len(kept_tensors),
            "input_bytes": input_bytes,
            "output_bytes": output_bytes,
        },
        "modules_to_not_convert": list(modules_to_not_convert),
        "kept_tensors": list(kept_tensors),
        "tensors": list(tensors),
    }


def summarize(report: Mapping[str, Any]) -> dict[str, Any]:
    """The compact summary the CLI prints with ``--format json`` (no per-tensor rows)."""
    model = report["model"]
    tensors = report["tensors"]
    worst = max(tensors, key=lambda row: row["relative_error"]) if tensors else None
    return {
        **report["options"],
        "relative_error": model["relative_error"],
        "snr_db": model["snr_db"],
        "quantized_tensors": model["quantized_tensors"],
        "kept_tensors": model["kept_tensors"],
        "input_bytes": model["input_bytes"],
        "output_bytes": model["output_bytes"],
        "modules_to_not_convert": report["modules_to_not_convert"],
        "worst_tensor": None if worst is None else {
            "name": worst["name"], "relative_error": worst["relative_error"], "snr_db": worst["snr_db"]
        },
    }


def write_report(out_dir: Path, report: Mapping[str, Any]) -> Path:
    path = Path(out_dir) / REPORT_FILE
    path.write_text(json.dumps(report, indent=1, sort_keys=False) + "\n")
    return path


def read_report(out_dir: Path) -> dict[str, Any]:
    return json.loads((Path(out_dir) / REPORT_FILE).read_text())
