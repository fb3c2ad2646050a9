"""``neuronpack convert-eagle``: make an EAGLE draft loadable by NxD Inference (target head added, EAGLE-3 renamed)."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from neuronpack.cli._console import OutputFormat, RichReporter, print_result, stderr
from neuronpack.cli._options import FormatOpt, ProgressOpt, QuietOpt, check_plain_text
from neuronpack.cli._progress import ProgressMode

if TYPE_CHECKING:
    from neuronpack.convert.eagle import EagleResult


class EagleDtype(str, Enum):
    auto = "auto"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"


def convert_eagle_command(
    *,
    draft: Annotated[str, typer.Option(
        "--draft", callback=check_plain_text, help="EAGLE-1/2 or EAGLE-3 draft: local directory or hub id")],
    target: Annotated[str, typer.Option(
        "--target", callback=check_plain_text, help="the target model the draft was trained for (dir or id)")],
    out: Annotated[Path, typer.Option("--out", help="new output directory (must not exist)")],
    dtype: Annotated[
        EagleDtype,
        typer.Option("--dtype", help="auto keeps the draft's dtype and casts only the added target tensors; "
                     "float16/bfloat16/float32 cast every floating tensor"),
    ] = EagleDtype.auto,
    overwrite_head: Annotated[
        bool, typer.Option("--overwrite-head", help="replace an EAGLE-1/2 draft's own lm_head with the target's")
    ] = False,
    output_format: FormatOpt = OutputFormat.text,
    progress: ProgressOpt = ProgressMode.auto,
    quiet: QuietOpt = False,
) -> None:
    """Convert an EAGLE draft for NxD Inference: the target's head added, config.json written for NxDI.

    EAGLE-1/2 drafts get the target's lm_head, EAGLE-3 drafts its embed_tokens and their midlayer.* renamed to
    layers.0.*; config.json gets fc_bias and the NeuronConfig hints.

    Of the target it reads only the head or embedding it adds (in row chunks), never its other weights.
    """
    from neuronpack.convert.eagle import convert_eagle

    # numpy casts the head, element-wise: its BLAS is never used, but OpenBLAS starts a thread per core when numpy is
    # imported, and they spin for a while (~60 ms of CPU on the 2-core build machine, taken from the copies). A
    # process of its own: nothing else here uses BLAS; a user's own setting is kept.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    reporter = RichReporter(quiet=quiet, progress=progress)
    result = convert_eagle(draft, target, out, dtype=dtype.value, overwrite_head=overwrite_head, reporter=reporter)
    if not quiet and output_format is OutputFormat.text:
        _print_summary(result)
    print_result(output_format, result.to_dict(), str(result.out))


def _print_summary(result: EagleResult) -> None:
    added = ", ".join(f"{a['name']} {'x'.join(map(str, a['shape']))} {a['dtype']} (from {a['from']})"
                      for a in result.added)
    renamed = f", renamed {len(result.renamed)} midlayer.* -> layers.0.*" if result.renamed else ""
    lines = [f"{result.layout} draft converted: added {added}{renamed}"]
    casts = ", ".join(f"{c['name']} {c['from']}->{c['to']}" for c in result.casts)
    lines.append(f"cast: {casts}" if casts else "cast: none (draft tensors copied bit for bit)")
    hints = ", ".join(f"{k}={str(v).lower()}" for k, v in result.nxd_hints.items())
    lines.append(f"NxDI hints: {hints}")
    for line in lines:
        stderr.line(line)
