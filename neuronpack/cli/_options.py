"""Reusable option aliases, so every command spells a shared flag the same way (and names its parameter the same:
``output_format``, ``quiet``, ``root``, ``set_``). Values the domain would refuse are checked here, so a bad flag
is a usage error (exit 2) everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from neuronpack.cli._console import OutputFormat
from neuronpack.cli._progress import ProgressMode
from neuronpack.errors import NeuronpackError

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


def _check_sets(values: list[str] | None) -> list[str] | None:
    from neuronpack.recipe_input import parse_set

    for assignment in values or ():
        try:
            parse_set(assignment)
        except NeuronpackError as exc:
            raise typer.BadParameter(exc.what) from None
    return values


def check_plain_text(value: str | list[str] | None) -> str | list[str] | None:
    """Callback of every option whose value goes into a recipe or a manifest (model sources, names, globs): a control
    character (a newline, ESC, ...) is a usage error (exit 2), never a truncated or split value."""
    from neuronpack.text import control_character_problem

    for text in [value] if isinstance(value, str) else value or ():
        problem = control_character_problem(str(text))
        if problem is not None:
            raise typer.BadParameter(f"{problem}; give one line of plain text")
    return value


SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", callback=_check_sets, help="override a recipe field: --set target.batch_size=4"),
]
ProgressOpt = Annotated[
    ProgressMode,
    typer.Option("--progress", help="auto: bars on a terminal, plain log lines otherwise (CI); rich, plain or none"),
]
RemoteOpt = Annotated[
    str | None,
    typer.Option("--remote", envvar="NEURONPACK_REMOTE",
                 help="remote artifact store: s3://bucket/prefix or file:///path (default $NEURONPACK_REMOTE)"),
]
StoreOpt = Annotated[
    str | None, typer.Option("--remote", help="act on a remote store (s3://bucket/prefix or file:///path) instead")
]
EndpointOpt = Annotated[
    str | None,
    typer.Option("--endpoint-url",
                 help="S3-compatible endpoint (MinIO, Ceph...); default: AWS_ENDPOINT_URL or AWS's own"),
]
