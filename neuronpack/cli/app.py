"""The one place where every command is registered.

Command modules import heavy libraries (torch, transformers) inside their functions, so `neuronpack --version` and
`neuronpack buckets` stay fast and torch-free.
"""

from __future__ import annotations

import functools
import gc
import importlib
import sys
from collections.abc import Callable
from typing import Annotated

import typer

from neuronpack import __version__
from neuronpack.cli._console import handle_errors

# command -> (module of neuronpack.cli, function): a module is imported only when its command is built
_COMMANDS = {
    "compile": ("compile_cmd", "compile_command"),
    "quantize": ("quantize_cmd", "quantize_command"),
    "convert-eagle": ("eagle_cmd", "convert_eagle_command"),
    "serve": ("serve_cmd", "serve_command"),
    "generate": ("generate_cmd", "generate_command"),
    "eval": ("eval_cmd", "eval_command"),
    "inspect": ("artifacts_cmd", "inspect_command"),
    "verify": ("artifacts_cmd", "verify_command"),
    "ls": ("artifacts_cmd", "ls_command"),
    "gc": ("artifacts_cmd", "gc_command"),
    "push": ("remote_cmd", "push_command"),
    "pull": ("remote_cmd", "pull_command"),
    "doctor": ("doctor_cmd", "doctor_command"),
    "import-gguf": ("gguf_cmd", "import_gguf_command"),
}


# command group -> (module, function returning its typer.Typer): `buckets` takes options itself and has subcommands
_GROUPS = {"buckets": ("buckets_cmd", "buckets_app")}


def _command(name: str) -> Callable[..., None]:
    module, function = _COMMANDS[name]
    return getattr(importlib.import_module(f"neuronpack.cli.{module}"), function)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"neuronpack {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """neuronpack: build once, serve everywhere."""


def _typer_app(names: list[str]) -> typer.Typer:
    cli = typer.Typer(
        name="neuronpack",
        help="Compile and package LLMs ahead of time for AWS Neuron and vLLM (NxD Inference, transformers-neuronx, the "
        "vLLM Neuron plugin), with a portable PyTorch backend that runs on any CPU.\n\n"
        "Run `neuronpack COMMAND --help` for a command's details.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    for name in names:
        if name in _GROUPS:
            module, function = _GROUPS[name]
            group = getattr(importlib.import_module(f"neuronpack.cli.{module}"), function)()
            cli.add_typer(group, name=name)
        else:
            cli.command(name)(handle_errors(_command(name)))
    cli.callback()(_root)
    return cli


@functools.cache
def _full_app() -> typer.Typer:
    return _typer_app([*_COMMANDS, *_GROUPS])


def __getattr__(name: str) -> typer.Typer:
    """``app``: every command (``from neuronpack.cli.app import app``, e.g. for typer's CliRunner), built on first
    use."""
    if name == "app":
        return _full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """The ``neuronpack`` entry point. When the first argument names a command, only that command is built, and only
    its module is imported: typer builds the click parameters of every registered command before it parses a flag
    (~15 ms of start-up), and the command's usage, help and errors are the same either way (they name ``neuronpack
    <command>``)."""
    single = len(sys.argv) > 1 and (sys.argv[1] in _COMMANDS or sys.argv[1] in _GROUPS)
    try:
        (_typer_app([sys.argv[1]]) if single else _full_app())()
    finally:
        # The interpreter's exit then skips a last garbage collection over every object of typer, click, rich and
        # numpy (~8 ms of each command's wall time); files, threads and atexit hooks are closed as before.
        gc.freeze()
