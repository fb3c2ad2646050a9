"""`neuronpack buckets plan`: buckets planned from a request log, beside the recipe's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from neuronpack.cli._console import OutputFormat, print_result
from neuronpack.cli._options import FormatOpt, RootOpt, SetOpt


def plan_command(
    *,
    traffic: Annotated[Path, typer.Option("--traffic", help="request log: JSON lines or CSV (docs/buckets.md)")],
    recipe: Annotated[Path | None, typer.Option("--recipe", "-r", help="the recipe to plan (and --write)")] = None,
    framework: Annotated[
        str | None, typer.Option("--framework", help="nxd, tnx, vneuron or torch (default: the recipe's)")
    ] = None,
    max_graphs: Annotated[
        int | None, typer.Option("--max-graphs", min=1, help="graph budget (default: as many as the recipe has)")
    ] = None,
    compile_budget: Annotated[
        float | None, typer.Option("--compile-budget", min=0, help="compile budget in seconds (graphs: it over "
                                   "--graph-seconds, else over the seconds the store's artifacts recorded)")
    ] = None,
    graph_seconds: Annotated[
        float | None, typer.Option("--graph-seconds", min=0.001, help="seconds one graph takes to compile")
    ] = None,
    root: RootOpt = None,
    model: Annotated[
        Path | None, typer.Option("--model", help="checkpoint whose config.json sets the cost model's shape")
    ] = None,
    kv_weight: Annotated[
        float | None, typer.Option("--kv-weight", help="one padded KV position in padded "
                                   "prompt tokens (default: from the model's shape, docs/buckets.md)")
    ] = None,
    write: Annotated[bool, typer.Option("--write", help="write the plan into --recipe (atomically)")] = False,
    set_: SetOpt = None,
    output_format: FormatOpt = OutputFormat.text,
) -> None:
    """Plan context, token-generation and batch buckets that pad a request log least within a graph budget."""
    from neuronpack.artifacts.store import artifacts_root
    from neuronpack.planner.run import plan_buckets_command

    result = plan_buckets_command(traffic, recipe=recipe, overrides=set_ or [], framework=framework,
                                  max_graphs=max_graphs, compile_budget=compile_budget, graph_seconds=graph_seconds,
                                  model=model, write=write, kv_weight=kv_weight, store=artifacts_root(root))
    print_result(output_format, result.to_dict(), _render(result))


def _render(result):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    report = result.report
    now, new = report.current, report.planned
    table = Table(title=f"{report.framework} buckets for {report.requests} requests (current vs planned)")
    table.add_column("")
    table.add_column("current", overflow="fold")
    table.add_column("planned", overflow="fold")

    def row(name: str, value) -> None:
        table.add_row(name, value(now), value(new))

    def pad(mean: float, p50: float, p90: float) -> str:
        return f"{mean:.1f} (p50 {p50:g}, p90 {p90:g})"

    row("context buckets", lambda c: ", ".join(map(str, c.context)))
    row("token-generation buckets", lambda c: ", ".join(map(str, c.token_generation)))
    row("batch buckets", lambda c: ", ".join(map(str, c.batch)))
    row("graphs", lambda c: str(c.graphs))
    row("compile seconds (estimated)", lambda c: "-" if c.compile_seconds is None else f"{c.compile_seconds:g}")
    row("padded prompt tokens / request", lambda c: pad(c.padding.prompt_mean, c.padding.prompt_p50,
                                                         c.padding.prompt_p90))
    row("padded KV positions / token", lambda c: pad(c.padding.kv_per_token, c.padding.kv_p50, c.padding.kv_p90))
    row("padded batch rows / step", lambda c: f"{c.padding.rows_per_step:.2f}")
    row("padding cost / request", lambda c: f"{c.cost:.1f}")
    lines = ["per request: mean (p50, p90); cost in padded prompt tokens, one padded KV position (or batch row "
             f"position) = {report.cost.kv_weight:.3g} of them ({report.cost.shape_from})"]
    if result.graph_seconds is not None:
        lines.append(f"graph compile seconds: {result.graph_seconds.describe()}")
    lines += report.notes
    if result.written:
        lines.append(f"wrote the plan into {result.written}")
    elif result.set_lines:
        lines += ["", "recipe settings (or --write with --recipe):", *result.set_lines]
    return Group(table, Text("\n".join(lines)))
