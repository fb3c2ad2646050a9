"""The streaming half of ``neuronpack quantize``: plan the output tensors from the input headers, then read,
quantize and write each matrix in row chunks, so peak memory is a few chunks whatever the model size.

Output order follows the input's storage order; each quantized ``<prefix>.weight`` is followed by its
``<prefix>.scale``. Unquantized tensors keep their dtype and are copied (large ones in row chunks too). A tied head
being untied (``plan.untie_from``) comes last: ``lm_head.weight`` quantized from the embedding's rows, and its scale.

Example::

    report = write_quantized(ckpt, plan, options, staging, reporter, max_shard_bytes=4 * 2**30)
    report["model"]["snr_db"]
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.checkpoint import Checkpoint, copy_aux_files
from neuronpack.convert.quant_options import QuantizeOptions
from neuronpack.convert.quant_plan import LM_HEAD, QuantPlan, module_prefix
from neuronpack.convert.quant_report import build_report, tensor_entry, write_report
from neuronpack.errors import QuantizationError
from neuronpack.progress import Reporter

if TYPE_CHECKING:
    import torch


METHOD = "neuronpack-symmetric"
# Rows per chunk are chosen so a chunk holds about this many elements: 4M float32 = 16 MiB per temporary.
CHUNK_ELEMENTS = 4 * 2**20


def write_quantized(
    ckpt: Checkpoint, plan: QuantPlan, options: QuantizeOptions, staging: Path, reporter: Reporter,
    max_shard_bytes: int,
) -> dict[str, Any]:
    """Write the quantized checkpoint (weights, config.json, tokenizer files, report) into ``staging``; return the
    report. Warns (through ``reporter``) about --skip globs that matched nothing and a tied lm_head."""
    from neuronpack.checkpoint import write_safetensors_sharded
    from neuronpack.convert.quant_math import ErrorAccumulator

    for glob in plan.unmatched_skips:
        reporter.warn(f"--skip {glob!r} matches no Linear module; nothing was skipped for it")
    if options.include_lm_head and plan.lm_head_tied and plan.untie_from is None:
        reporter.warn("lm_head is tied to the input embeddings and none was found to untie it from; it stays "
                      "unquantized")
    rows: list[dict[str, Any]] = []
    model_stats = ErrorAccumulator()
    names = ckpt.names()
    with reporter.task(f"quantize {options.dtype} {options.granularity}", total=len(names)) as task:
        chunks = _chunks(ckpt, names, set(plan.quantize), options, rows, model_stats, task, plan.untie_from)
        metadata = {"quantization": f"{METHOD} {options.dtype} {options.granularity}"}
        specs = _specs(ckpt, names, set(plan.quantize), options, plan.untie_from)
        shards = write_safetensors_sharded(staging, specs, chunks,
                                           max_shard_bytes=max_shard_bytes, metadata=metadata)
    _write_config(ckpt, plan, options, staging)
    copy_aux_files(ckpt.root, staging)
    kept = [n for n in names if n not in set(plan.quantize)]
    report = build_report(
        rows, model_stats, options.as_dict(), modules_to_not_convert=plan.modules_to_not_convert,
        kept_tensors=kept, input_bytes=sum(ckpt.info(n).nbytes for n in names),
        output_bytes=sum(p.stat().st_size for p in shards),
    )
    write_report(staging, report)
    return report


def _write_config(ckpt: Checkpoint, plan: QuantPlan, options: QuantizeOptions, staging: Path) -> None:
    config = dict(ckpt.config)
    config["quantization"] = {
        "method": METHOD,
        "dtype": options.dtype,
        "granularity": options.granularity,
        "modules_to_not_convert": list(plan.modules_to_not_convert),
        "skip": list(options.skip),
        "include_lm_head": options.include_lm_head,
        "scale_dtype": "float32",
        "qmax": 127 if options.dtype == "int8" else 240,
    }
    if options.include_experts:
        config["quantization"]["include_experts"] = True
    if plan.untie_from is not None:
        config["tie_word_embeddings"] = False  # the checkpoint now has its own (quantized) lm_head
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _specs(ckpt: Checkpoint, names: Sequence[str], quantize: set[str], options: QuantizeOptions,
           untie_from: str | None) -> list:
    """Output layout in input storage order; each quantized weight is followed by its scale; an untied head last."""
    from neuronpack.checkpoint import TensorSpec

    specs = []
    for name in names:
        info = ckpt.info(name)
        if name not in quantize:
            specs.append(TensorSpec(name, _torch_dtype(info.dtype), info.shape))
            continue
        specs += _quantized_specs(name, info.shape, options)
    if untie_from is not None:
        specs += _quantized_specs(LM_HEAD, ckpt.info(untie_from).shape, options)
    return specs


def _quantized_specs(name: str, shape: tuple[int, ...], options: QuantizeOptions) -> list:
    import torch

    from neuronpack.checkpoint import TensorSpec
    from neuronpack.convert.quant_math import TORCH_DTYPE

    scale_shape = (shape[0], 1) if options.granularity == "per-channel" else (1,)
    return [TensorSpec(name, TORCH_DTYPE[options.dtype], shape),
            TensorSpec(module_prefix(name) + ".scale", torch.float32, scale_shape)]


def _chunks(ckpt, names, quantize, options, rows, model_stats, task,
            untie_from: str | None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, row chunk) in spec order; fills ``rows`` and ``model_stats`` as a side effect."""
    for name in names:
        if name in quantize:
            yield from _quantized_entry(ckpt, name, name, options, rows, model_stats)
        else:
            yield from _passthrough_chunks(ckpt, name)
        task.advance()
    if untie_from is not None:
        yield from _quantized_entry(ckpt, untie_from, LM_HEAD, options, rows, model_stats)


def _quantized_entry(ckpt, source, name, options, rows, model_stats) -> Iterator[tuple[str, torch.Tensor]]:
    stats = yield from _quantized_chunks(ckpt, source, options, name)
    info = ckpt.info(source)
    rows.append(tensor_entry(name, info.shape, info.dtype, stats))
    model_stats.merge(stats)


def _quantized_chunks(ckpt: Checkpoint, source: str, options: QuantizeOptions, name: str):
    """Quantize one [out, in] matrix ``source`` in row chunks: yield int8/fp8 rows as ``name``, then the scale;
    return its error stats. A NaN or infinity in ``source`` raises QuantizationError (int8 has no NaN: it would
    become an arbitrary integer and the model silent garbage)."""
    import torch

    from neuronpack.convert.quant_math import ErrorAccumulator, chunk_amax, quantize_rows, scale_from_amax

    out_features, in_features = ckpt.info(source).shape
    step = max(1, CHUNK_ELEMENTS // max(1, in_features))
    spans = [(s, min(s + step, out_features)) for s in range(0, out_features, step)]
    tensor_scale = None
    if options.granularity == "per-tensor":
        amax = 0.0
        for start, stop in spans:
            w = ckpt.get_rows(source, start, stop)  # [R, in]
            chunk = chunk_amax(w)  # NaN or inf when the chunk holds one
            if not math.isfinite(chunk):
                _check_finite(ckpt, source, w, start)
            amax = max(amax, chunk)
        tensor_scale = scale_from_amax(torch.tensor([amax]), options.dtype)  # [1]
    stats = ErrorAccumulator()
    row_scales = []  # per-channel: one [R, 1] per chunk
    for start, stop in spans:
        w = ckpt.get_rows(source, start, stop)  # [R, in] in the checkpoint dtype
        chunk_stats = ErrorAccumulator()
        q, scale = quantize_rows(w, options.dtype, tensor_scale, stats=chunk_stats)
        # The chunk's sum of squares is non-finite when it holds a NaN or an inf: the check costs no extra pass
        # (and only then are the rows searched, so a finite chunk whose squares overflow passes).
        if not math.isfinite(chunk_stats.signal):
            _check_finite(ckpt, source, w, start)
        stats.merge(chunk_stats)
        row_scales.append(scale)
        yield name, q
    scale_name = module_prefix(name) + ".scale"
    yield scale_name, tensor_scale if tensor_scale is not None else torch.cat(row_scales, dim=0)  # [out, 1]
    return stats


def _check_finite(ckpt: Checkpoint, source: str, rows: torch.Tensor, first_row: int) -> None:
    """Raise QuantizationError naming ``source`` and its first non-finite element; ``rows`` start at ``first_row``."""
    from neuronpack.convert.quant_math import first_nonfinite

    found = first_nonfinite(rows)
    if found is None:
        return
    (row, col), value = found
    raise QuantizationError(
        f"tensor {source} holds {value} at index [{first_row + row}, {col}]: int8/fp8 cannot represent it",
        where=str(ckpt.root),
        fix="the checkpoint is corrupt (a diverged run or a bad conversion); repair or re-export the weights",
    )


def _passthrough_chunks(ckpt: Checkpoint, name: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Unquantized tensors keep their dtype; large ones (embeddings) are copied in row chunks too."""
    shape = ckpt.info(name).shape
    numel = 1
    for dim in shape:
        numel *= dim
    if len(shape) < 2 or numel <= CHUNK_ELEMENTS:
        yield name, ckpt.get(name)
        return
    step = max(1, CHUNK_ELEMENTS // max(1, numel // shape[0]))
    for start in range(0, shape[0], step):
        yield name, ckpt.get_rows(name, start, min(start + step, shape[0]))


def _torch_dtype(code: str) -> torch.dtype:
    from neuronpack.checkpoint.dtypes import torch_dtype

    try:
        return torch_dtype(code)
    except ValueError:
        raise QuantizationError(f"cannot carry a tensor of dtype {code} through quantization",
                                fix="convert that tensor to a standard dtype first") from None
