"""`neuronpack buckets`: the bucket plan NxD Inference would compile, as a table; `neuronpack buckets plan`
(buckets_plan_cmd.py): buckets planned from a request log."""

from __future__ import annotations

from typing import Annotated

import typer

from neuronpack.cli._console import OutputFormat, print_result
from neuronpack.cli._options import FormatOpt


def _ints(text: str | None) -> list[int] | str:
    if text is None or text.strip() in ("", "auto"):
        return "auto"
    from neuronpack.buckets import parse_tnx_bucket_env

    return list(parse_tnx_bucket_env(text, 0))


def _check_ints(text: str | None) -> str | None:
    """A bucket list that does not parse is a usage error (exit 2)."""
    from neuronpack.errors import NeuronpackError

    try:
        _ints(text)
    except NeuronpackError as exc:
        raise typer.BadParameter(exc.what) from None
    return text


def buckets_app() -> typer.Typer:
    """``buckets`` with its options (the plan of a sequence length) and the ``plan`` subcommand."""
    from neuronpack.cli._console import handle_errors
    from neuronpack.cli.buckets_plan_cmd import plan_command

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.callback(invoke_without_command=True)(handle_errors(buckets_command))
    app.command("plan")(handle_errors(plan_command))
    return app


def buckets_command(
    ctx: typer.Context,
    *,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", help="maximum total length (token-generation maximum); required "
                                 "without a subcommand")
    ] = None,
    max_context_length: Annotated[
        int | None, typer.Option("--max-context-length", help="maximum prompt length (default: seq-len)")
    ] = None,
    context: Annotated[
        str | None,
        typer.Option("--context", callback=_check_ints, help='context-encoding buckets, comma separated, or "auto"'),
    ] = None,
    token_gen: Annotated[
        str | None,
        typer.Option("--token-gen", callback=_check_ints, help='token-generation buckets, comma separated, or "auto"'),
    ] = None,
    no_bucketing: Annotated[bool, typer.Option("--no-bucketing", help="one bucket each (bucketing off)")] = False,
    output_format: FormatOpt = OutputFormat.text,
) -> None:
    """Print the bucket plan for a sequence length, or plan buckets from a request log (`buckets plan`).

    Without lists the plan is NxDI's auto formula; `neuronpack buckets plan --traffic FILE` chooses them from what a
    server recorded."""
    if ctx.invoked_subcommand is not None:
        return
    if seq_len is None:
        import click

        raise click.MissingParameter(param_hint="'--seq-len'", param_type="option")
    from neuronpack.buckets import plan_buckets

    plan = plan_buckets(seq_len, max_context_length, enabled=not no_bucketing, context=_ints(context),
                        token_generation=_ints(token_gen))
    from rich.table import Table

    table = Table(title=f"bucket plan (seq_len {plan.seq_len}, max_context_length {plan.max_context_length})")
    table.add_column("kind")
    table.add_column("buckets", overflow="fold")  # wraps between buckets; a bucket size is never cut
    table.add_column("graphs", justify="right", no_wrap=True)
    table.add_row("context encoding", ", ".join(map(str, plan.context)), str(len(plan.context)))
    table.add_row("token generation", ", ".join(map(str, plan.token_generation)), str(len(plan.token_generation)))
    print_result(output_format, plan.to_dict(), table)
