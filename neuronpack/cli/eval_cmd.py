"""`neuronpack eval`: compare an artifact with the checkpoint it was compiled from (exit 0 pass, 1 fail, 3 not run)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from neuronpack.cli._console import (
    LazyConsole,
    OutputFormat,
    RichReporter,
    cell,
    print_result,
    print_table,
    stdout,
)
from neuronpack.cli._options import FormatOpt, ProgressOpt, QuietOpt
from neuronpack.cli._progress import ProgressMode

if TYPE_CHECKING:
    from rich.console import Console

# Exit code when the check could not run here (NxDI / TNx artifacts need a Neuron device): not a pass, not a fail.
EXIT_NOT_RUN = 3


def eval_command(
    artifact: Annotated[Path, typer.Argument(help="an artifact directory (neuron-compiled-artifacts/<key>)")],
    *,
    reference: Annotated[
        Path | None,
        typer.Option("--reference", help="HF checkpoint to compare with (default: the one the manifest records)"),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option("--prompts", help='JSONL file, one {"prompt": ...} or {"messages": [...]} per line '
                     "(default: 6 built-in prompts)"),
    ] = None,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", min=1, help="greedy reference tokens scored after each prompt")
    ] = 32,
    min_top1: Annotated[
        float | None, typer.Option("--min-top1", min=0.0, max=1.0, help="override the minimum top-1 agreement")
    ] = None,
    max_kl_mean: Annotated[
        float | None,
        typer.Option("--max-kl-mean", min=0.0, help="override the limit on the mean KL(reference || artifact)"),
    ] = None,
    max_kl: Annotated[
        float | None,
        typer.Option("--max-kl", min=0.0, help="override the limit on the largest KL(reference || artifact) of any "
                     "position"),
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="torch intra-op threads (default: all cores)")
    ] = None,
    output_format: FormatOpt = OutputFormat.text,
    progress: ProgressOpt = ProgressMode.auto,
    quiet: QuietOpt = False,
) -> None:
    """Compare ARTIFACT with its reference checkpoint on the same prompts, teacher-forced.

    Per-position agreement is judged by the thresholds of the artifact's precision (exit 0 pass, 1 fail, 3 not run:
    nxd artifacts run through NxD Inference on the CPU where it imports; transformers-neuronx ones need a device)."""
    from neuronpack.accuracy import THRESHOLDS, check_accuracy, load_prompts, subject_from_manifest, with_thresholds
    from neuronpack.artifacts.manifest import read_manifest

    subject = subject_from_manifest(read_manifest(artifact), artifact, reference)
    limits = THRESHOLDS.get(subject.precision)
    if limits is not None:
        limits = with_thresholds(limits, min_top1_agreement=min_top1, max_kl_mean=max_kl_mean, max_kl=max_kl)
    if subject.framework == "torch":
        from neuronpack.runtime.loader import configure_threads

        configure_threads(threads)
    report = check_accuracy(subject, prompts=load_prompts(prompts) if prompts else None,
                            new_tokens=max_new_tokens, thresholds=limits,
                            reporter=RichReporter(quiet=quiet, progress=progress))
    data = report.to_dict()
    if output_format is OutputFormat.json:
        print_result(output_format, data)
    else:
        print_report(data, str(artifact))
    raise typer.Exit(exit_code(data))


def exit_code(accuracy: dict[str, Any]) -> int:
    """0 passed, 1 failed, 3 not run (the documented rule CI gates on); ``accuracy`` is ``AccuracyReport.to_dict()``."""
    from neuronpack.accuracy import NOT_RUN, PASSED

    status = accuracy["status"]
    return 0 if status == PASSED else EXIT_NOT_RUN if status == NOT_RUN else 1


def print_report(data: dict[str, Any], artifact: str, console: Console | LazyConsole = stdout) -> None:
    """The human-readable report of ``AccuracyReport.to_dict()``: one row per prompt, the summary, the verdict
    (failures on stderr). Shared with ``compile --check-accuracy``, which prints it on stderr."""
    if data["status"] == "not_run":
        console.print(f"not run: {data['reason']}. A check of this artifact would:", markup=False)
        for step in data["plan"]:
            console.print(f"  - {step}", markup=False)
        return
    from rich.table import Table

    table = Table(title=cell(f"{artifact} ({data['precision']}) vs {data['reference']}"))
    for col in ("prompt", "tokens", "top-1", "max |diff|", "mean |diff|", "mean KL", "max KL", "greedy match"):
        # figures are never cut: only the prompt labels wrap (print_table: natural width into a pipe or a log)
        table.add_column(col, justify="left" if col == "prompt" else "right", no_wrap=col != "prompt")
    summary = data["summary"] or {}
    rows = [*data["prompts"], {"name": "all", **summary}]
    if "vs_dequantized" in summary:  # a quantized nxd artifact: the same scores against the dequantized reference
        rows.append({"name": "all vs dequantized", **summary["vs_dequantized"]})
    for p in rows:
        greedy = (f"{p['greedy_match']}/{p['continuation_tokens']}" if "greedy_match" in p
                  else f"min {p['greedy_match_min']}/{p['continuation_tokens']}")
        tokens = f"{p['prompt_tokens']}+{p['continuation_tokens']}" if "prompt_tokens" in p else str(p["positions"])
        table.add_row(cell(p["name"] + (" (cut)" if p.get("truncated") else "")), tokens, f"{p['top1_agreement']:.4f}",
                      f"{p['max_abs_diff']:.3g}", f"{p['mean_abs_diff']:.3g}", f"{p['kl_mean']:.3g}",
                      f"{p['kl_max']:.3g}", greedy)
    print_table(console, table)
    limits = ", ".join(f"{k}={v}" for k, v in data["thresholds"].items() if v not in (None, False))
    verdict = "PASS" if not data["failures"] else "FAIL"
    console.print(f"{verdict} ({data['precision']} thresholds: {limits})", markup=False)
    for failure in data["failures"]:  # part of the report: with it (stdout for eval, stderr for compile)
        console.print(f"  {failure}", markup=False)
    for note in data["plan"]:  # what a check that ran did not cover (nxd on the CPU)
        console.print(f"note: {note}", markup=False)
