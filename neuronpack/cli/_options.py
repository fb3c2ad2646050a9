"""Reusable option aliases, so every command spells a shared flag the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from neuronpack.cli._console import OutputFormat

FormatOpt = Annotated[
    OutputFormat, typer.Option("--format", help="text for people, json for CI pipelines (one object on stdout)")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bars or info lines on stderr")]
RootOpt = Annotated[
    Path | None,
    typer.Option(
        "--root",
        "--out-root",
        help="artifact root (default: $NEURONPACK_ARTIFACTS_ROOT, else the current directory)",
    ),
]
