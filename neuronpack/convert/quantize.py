"""``neuronpack quantize``: symmetric int8 / fp8 weight quantization of a Hugging Face checkpoint in NxDI's format.

Every decoder Linear weight ``<prefix>.weight`` becomes int8 (or float8_e4m3fn) plus ``<prefix>.scale`` float32,
shape ``[out_features, 1]`` (per-channel) or ``[1]`` (per-tensor); everything else keeps its dtype. The output is a
complete checkpoint directory (sharded safetensors + index, config.json with a ``quantization`` section, tokenizer
files, ``quantization_report.json``) usable as NxDI's ``quantized_checkpoints_path``.

Memory stays bounded whatever the model size: the output layout is planned from the input headers, then each matrix
is read, quantized and written in row chunks (per-tensor scales take one extra amax pass over the rows).

The output is content-addressed: ``neuronpack-quantize.json`` records a key over the input weights (names, shapes,
dtypes, sha256 of every file read), the options and the neuronpack version. Quantizing the same input into the same
``out`` again is a cache hit.

Example::

    opts = QuantizeOptions(dtype="int8", granularity="per-channel", skip=("layers.0.mlp",))
    result = quantize_checkpoint(Path("models/llama"), Path("models/llama-int8"), opts)
    result.cache_hit, result.summary["snr_db"]        # (False, 41.9)
    nxd_quantization_fields(opts, quantized_checkpoints_path=result.out)["quantization_type"]
    # "per_channel_symmetric"
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuronpack import __version__
from neuronpack.checkpoint import AUX_FILES, Checkpoint, open_checkpoint
from neuronpack.convert.quant_options import QuantizeOptions
from neuronpack.convert.quant_plan import (
    QuantPlan,
    biased_projections,
    check_not_quantized,
    module_prefix,
    plan_quantization,
)
from neuronpack.convert.quant_report import read_report, summarize
from neuronpack.convert.quant_stream import METHOD, write_quantized
from neuronpack.digest import file_sha256, sha256_json
from neuronpack.errors import OutputExistsError, QuantizationError
from neuronpack.fsutil import atomic_output_dir, check_output_path
from neuronpack.progress import NullReporter, Reporter

RECORD_FILE = "neuronpack-quantize.json"
KEY_SCHEMA = 1
QUANTIZED_ROOT = "quantized-checkpoints"
NXD_TYPE = {"per-channel": "per_channel_symmetric", "per-tensor": "per_tensor_symmetric"}
NXD_DTYPE = {"int8": "int8", "fp8": "f8e4m3"}


@dataclass(frozen=True)
class QuantizeResult:
    """Where the quantized checkpoint is, its key, whether it was reused, and the report summary."""

    out: Path
    key: str
    cache_hit: bool
    summary: dict[str, Any] = field(default_factory=dict)


def quantize_checkpoint(
    model_dir: Path,
    out: Path,
    options: QuantizeOptions,
    *,
    reporter: Reporter | None = None,
    max_shard_bytes: int = 4 * 2**30,
) -> QuantizeResult:
    """Quantize the checkpoint in ``model_dir`` into the new directory ``out`` (atomic: all or nothing).

    Raises QuantizationError for an already-quantized input or nothing to quantize, OutputExistsError when ``out``
    exists with another key. ``out`` existing with the same key is a cache hit (nothing is read or written).

    Example::

        res = quantize_checkpoint(Path("llama"), Path("llama-int8"), QuantizeOptions("int8"))
        res.summary["relative_error"]      # 0.0052
    """
    reporter = reporter or NullReporter()
    model_dir, out = Path(model_dir), Path(out).expanduser().absolute()
    check_output_path(out, inputs=[model_dir], overwrite=True)  # overlap with the input only; existence below
    ckpt = open_checkpoint(model_dir)
    plan = _plan(ckpt, options)
    key, key_inputs = quantization_key(ckpt, options)
    if out.exists():
        return _reuse(out, key)
    started = time.perf_counter()
    try:
        with atomic_output_dir(out, inputs=[model_dir], label=f"{out.name}-") as staging:
            report = write_quantized(ckpt, plan, options, staging, reporter, max_shard_bytes)
            _write_record(staging, key, key_inputs, ckpt, time.perf_counter() - started)
    except OSError as exc:
        # Another process published the same key first (rename onto a non-empty dir): reuse its output.
        if (out / RECORD_FILE).is_file():
            return _reuse(out, key)
        raise QuantizationError(f"cannot write the quantized checkpoint: {exc.strerror or exc}", where=str(out),
                                fix="check free disk space and permissions of the output's parent directory") \
            from None
    return QuantizeResult(out=out, key=key, cache_hit=False, summary=summarize(report))


def quantized_checkpoint_path(root: Path, model_dir: Path, options: QuantizeOptions) -> Path:
    """Where the compile pipeline keeps the quantized copy: ``root / "quantized-checkpoints" / <key>``.

    Torch-free for safetensors checkpoints (headers and cached file digests only).

    Example::

        path = quantized_checkpoint_path(Path("artifacts"), model_dir, QuantizeOptions("int8"))
        quantize_checkpoint(model_dir, path, QuantizeOptions("int8"))   # a cache hit the second time
    """
    key, _inputs = quantization_key(open_checkpoint(Path(model_dir)), options)
    return Path(root) / QUANTIZED_ROOT / key


def quantization_key(ckpt: Checkpoint, options: QuantizeOptions) -> tuple[str, dict[str, Any]]:
    """sha256 over the input weight identity, the sha256 of every file read, the options and neuronpack's version."""
    files = [*ckpt.files, ckpt.root / "config.json", *(ckpt.root / n for n in AUX_FILES)]
    digests = {p.name: file_sha256(p) for p in files if p.is_file()}
    key_options = {**options.as_dict(), "skip": sorted(options.skip)}
    if options.include_lm_head:
        key_options["tied_head"] = "untied"  # a tied head is now untied and quantized (it was kept float): new key
    inputs = {
        "schema": KEY_SCHEMA,
        "method": METHOD,
        "neuronpack": __version__,
        "options": key_options,
        "weights": ckpt.weight_identity(),
        "files": digests,
    }
    return sha256_json(inputs), inputs


def nxd_quantization_fields(options: QuantizeOptions, quantized_checkpoints_path: Path | None = None,
                            source: Path | None = None) -> dict:
    """The NxDI NeuronConfig kwargs for a checkpoint quantized with ``options``.

    ``modules_to_not_convert`` is read from the quantized checkpoint's config.json when ``quantized_checkpoints_path``
    holds one (the list resolved against the real module names); before it exists (a dry-run), planned from the
    ``source`` checkpoint's headers, as the quantizer will (the experts and biased projections a family keeps float
    included); without either, derived from the options (lm_head plus literal --skip names).

    Example::

        nxd_quantization_fields(QuantizeOptions("fp8"), Path("q"))
        # {"quantized": True, "quantized_checkpoints_path": "q", "quantization_type": "per_channel_symmetric",
        #  "quantization_dtype": "f8e4m3", "modules_to_not_convert": ["lm_head"]}
    """
    modules = _recorded_modules(quantized_checkpoints_path)
    if modules is None and source is not None and (Path(source) / "config.json").is_file():
        modules = list(_plan(open_checkpoint(Path(source)), options).modules_to_not_convert)
    if modules is None:
        modules = [] if options.include_lm_head else ["lm_head"]
        modules += [s.removeprefix("model.") for s in options.skip if not any(c in s for c in "*?[")]
    return {
        "quantized": True,
        "quantized_checkpoints_path": None if quantized_checkpoints_path is None else str(quantized_checkpoints_path),
        "quantization_type": NXD_TYPE[options.granularity],
        "quantization_dtype": NXD_DTYPE[options.dtype],
        "modules_to_not_convert": modules,
    }


def quantized_biased_projections(options: QuantizeOptions, quantized: Path | None, source: Path | None) -> list[str]:
    """The attention projections with a bias a quantized checkpoint holds quantized, which NxD Inference cannot load
    (quant_plan.biased_projections): read from ``quantized`` when it exists, planned from ``source`` before it does
    (a dry-run). Torch-free (headers only)."""
    if quantized is not None and (Path(quantized) / "config.json").is_file():
        names = set(open_checkpoint(Path(quantized)).names())
        return [p for p in biased_projections(names) if p + ".scale" in names]
    if source is not None and (Path(source) / "config.json").is_file():
        ckpt = open_checkpoint(Path(source))
        planned = {module_prefix(n) for n in _plan(ckpt, options).quantize}
        return [p for p in biased_projections(ckpt.names()) if p in planned]
    return []


def recorded_source(quantized_dir: Path) -> Path | None:
    """The checkpoint ``quantized_dir`` was quantized from, as its ``neuronpack-quantize.json`` records it, when that
    directory still holds exactly the files the key was computed over (sha256, from the digest cache when
    unchanged); None when there is no record, or the source is gone or changed.

    Example::

        recorded_source(Path("llama-int8"))     # Path("/models/llama"), or None once it was edited or removed
    """
    record = _read_record(Path(quantized_dir))
    source = record.get("source") if record else None
    files = ((record.get("key_inputs") or {}).get("files") or {}) if record else {}
    if not isinstance(source, str) or not isinstance(files, dict) or not files:
        return None
    root = Path(source)
    for name, digest in files.items():
        path = root / str(name)
        if not path.is_file() or file_sha256(path) != digest:
            return None
    return root


# --- planning and reuse -----------------------------------------------------------------------------------------
def _plan(ckpt: Checkpoint, options: QuantizeOptions) -> QuantPlan:
    infos = {name: ckpt.info(name) for name in ckpt.names()}
    check_not_quantized(infos, ckpt.config, where=str(ckpt.root))
    return plan_quantization(infos, ckpt.config, skip=options.skip, include_lm_head=options.include_lm_head,
                             include_experts=options.include_experts, where=str(ckpt.root))


def _reuse(out: Path, key: str) -> QuantizeResult:
    record = _read_record(out)
    if record is None:
        raise OutputExistsError("output already exists and is not a neuronpack quantized checkpoint",
                                where=str(out), fix="remove it or choose another --out")
    if record.get("key") != key:
        raise OutputExistsError(
            f"output already exists with different inputs or options (key {str(record.get('key'))[:12]} != "
            f"{key[:12]})", where=str(out), fix="remove it or choose another --out",
        )
    for name, size in record.get("files", {}).items():
        path = out / name
        if not path.is_file() or path.stat().st_size != size:
            raise OutputExistsError(f"output is incomplete or modified ({name} missing or resized)",
                                    where=str(out), fix="remove it and quantize again")
    return QuantizeResult(out=out, key=key, cache_hit=True, summary=summarize(read_report(out)))


def _read_record(out: Path) -> dict | None:
    try:
        record = json.loads((out / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _recorded_modules(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    try:
        section = json.loads((Path(path) / "config.json").read_text()).get("quantization") or {}
    except (OSError, ValueError, AttributeError):
        return None
    modules = section.get("modules_to_not_convert") if isinstance(section, dict) else None
    return list(modules) if isinstance(modules, list) else None


def _write_record(staging: Path, key: str, key_inputs: dict, ckpt: Checkpoint, seconds: float) -> None:
    files = {p.name: p.stat().st_size for p in sorted(staging.iterdir()) if p.is_file()}
    record = {"key": key, "key_inputs": key_inputs, "source": str(ckpt.root), "files": files,
              "seconds": round(seconds, 3), "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (staging / RECORD_FILE).write_text(json.dumps(record, indent=1) + "\n")
