"""The one place where every command is registered.

Command modules import heavy libraries (torch, transformers) inside their functions, so `neuronpack --version` and
`neuronpack buckets` stay fast and torch-free.
"""

from __future__ import annotations

from typing import Annotated

import typer

from neuronpack import __version__
from neuronpack.cli import (
    artifacts_cmd,
    buckets_cmd,
    compile_cmd,
    doctor_cmd,
    eagle_cmd,
    gguf_cmd,
    quantize_cmd,
    remote_cmd,
    serve_cmd,
)
from neuronpack.cli._console import handle_errors

app = typer.Typer(
    name="neuronpack",
    help="Compile and package LLMs ahead of time for AWS Neuron (NxD Inference / transformers-neuronx) and vLLM, "
    "with a portable PyTorch backend that runs on any CPU.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_COMMANDS = [
    ("compile", compile_cmd.compile_command),
    ("quantize", quantize_cmd.quantize_command),
    ("convert-eagle", eagle_cmd.convert_eagle_command),
    ("serve", serve_cmd.serve_command),
    ("generate", serve_cmd.generate_command),
    ("buckets", buckets_cmd.buckets_command),
    ("inspect", artifacts_cmd.inspect_command),
    ("verify", artifacts_cmd.verify_command),
    ("ls", artifacts_cmd.ls_command),
    ("gc", artifacts_cmd.gc_command),
    ("push", remote_cmd.push_command),
    ("pull", remote_cmd.pull_command),
    ("doctor", doctor_cmd.doctor_command),
    ("import-gguf", gguf_cmd.import_gguf_command),
]
for _name, _fn in _COMMANDS:
    app.command(_name)(handle_errors(_fn))


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"neuronpack {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """neuronpack: build once, serve everywhere."""


def main() -> None:
    app()
