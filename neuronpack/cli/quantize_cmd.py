"""``neuronpack quantize``: int8 / fp8 weight quantization of a checkpoint into NxDI's quantized-checkpoint format."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from neuronpack.cli._console import OutputFormat, RichReporter, cell, print_result, print_table, stderr
from neuronpack.cli._options import FormatOpt, ProgressOpt, QuietOpt, check_plain_text
from neuronpack.cli._progress import ProgressMode, human_bytes

# Above this many quantized tensors the table shows only the worst ones (the JSON report has them all).
FULL_TABLE_MAX = 24
WORST_SHOWN = 10


class QuantDtype(str, Enum):  # convert.quant_options.DTYPES
    int8 = "int8"
    fp8 = "fp8"


class Granularity(str, Enum):  # convert.quant_options.GRANULARITIES
    per_channel = "per-channel"
    per_tensor = "per-tensor"


def quantize_command(
    model: Annotated[str, typer.Argument(help="local checkpoint directory or hub id (org/name[@revision])",
                                           callback=check_plain_text)],
    *,
    out: Annotated[Path, typer.Option("--out", help="new output directory (must not exist, unless same inputs)")],
    dtype: Annotated[QuantDtype, typer.Option("--dtype", help="int8 or fp8 (float8 e4m3, clamped to +-240)")],
    granularity: Annotated[
        Granularity, typer.Option("--granularity", help="per-channel (one scale per output row) or per-tensor")
    ] = Granularity.per_channel,
    skip: Annotated[
        list[str] | None,
        typer.Option("--skip", callback=check_plain_text,
                     help="glob over module names to leave unquantized, e.g. 'layers.0.*' (repeatable)"),
    ] = None,
    include_lm_head: Annotated[
        bool, typer.Option("--include-lm-head", help="quantize lm_head too (a tied head is untied into its own)")
    ] = False,
    include_experts: Annotated[
        bool, typer.Option("--include-experts", help="quantize MoE experts too (portable backend only; NxD Inference "
                                                     "keeps them float)")
    ] = False,
    output_format: FormatOpt = OutputFormat.text,
    progress: ProgressOpt = ProgressMode.auto,
    quiet: QuietOpt = False,
) -> None:
    """Quantize every decoder Linear weight to int8 or fp8 (symmetric, float32 scales); write a report.

    Running again with the same inputs and options into the same --out reuses it (a cache hit).
    """
    from neuronpack.checkpoint import resolve_model
    from neuronpack.convert.quant_report import read_report
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint

    options = QuantizeOptions(dtype=dtype.value, granularity=granularity.value, skip=tuple(skip or ()),
                              include_lm_head=include_lm_head, include_experts=include_experts)
    reporter = RichReporter(quiet=quiet, progress=progress)
    model_dir = resolve_model(model, reporter=reporter)
    result = quantize_checkpoint(model_dir, out, options, reporter=reporter)
    if result.cache_hit:
        reporter.info(f"cache hit: {result.out} already holds this quantization (key {result.key[:12]})")
    if not quiet and output_format == OutputFormat.text:
        _print_table(read_report(result.out))
    print_result(output_format, {"out": str(result.out), "key": result.key, "cache_hit": result.cache_hit,
                                 **result.summary}, str(result.out))


def _print_table(report: dict[str, Any]) -> None:
    from rich.table import Table

    rows = report["tensors"]
    shown = rows if len(rows) <= FULL_TABLE_MAX else sorted(rows, key=lambda r: -r["relative_error"])[:WORST_SHOWN]
    options = report["options"]
    title = f"{options['dtype']} {options['granularity']}: {len(rows)} tensors quantized"
    if len(shown) < len(rows):
        title += f", {len(shown)} worst shown"
    table = Table(title=title, title_justify="left")
    # a long tensor name (an MoE expert's) folds onto the next line; the figures are never cut
    table.add_column("tensor", overflow="fold")
    for name in ("shape", "rel. error", "SNR dB"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in shown:
        table.add_row(cell(row["name"]), "x".join(map(str, row["shape"])), f"{row['relative_error']:.5f}",
                      _snr(row["snr_db"]))
    model = report["model"]
    table.add_section()
    table.add_row("whole model", "", f"{model['relative_error']:.5f}", _snr(model["snr_db"]), style="bold")
    print_table(stderr, table)
    size = f"weights {human_bytes(model['input_bytes'])} -> {human_bytes(model['output_bytes'])}"
    kept = ", ".join(report["modules_to_not_convert"]) or "none"  # printed with markup off
    stderr.print(f"{size}; left unquantized (modules_to_not_convert): {kept}", markup=False, soft_wrap=True)
    if len(shown) < len(rows):
        stderr.print("every tensor is in quantization_report.json", markup=False, soft_wrap=True)


def _snr(value: float | None) -> str:
    return "exact" if value is None else f"{value:.1f}"
