"""`neuronpack buckets`: the bucket plan NxD Inference would compile, as a table."""

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


def buckets_command(
    *,
    seq_len: Annotated[int, typer.Option("--seq-len", help="maximum total length (token-generation maximum)")],
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
    """Print the bucket plan for a sequence length (NxDI's auto formula unless lists are given)."""
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
