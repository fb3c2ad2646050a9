"""`neuronpack eval`: compare an artifact with the checkpoint it was compiled from (exit 0 pass, 1 fail, 3 not run)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from neuronpack.cli._accuracy_report import exit_code, print_report
from neuronpack.cli._console import OutputFormat, RichReporter, print_result
from neuronpack.cli._options import FormatOpt, ProgressOpt, QuietOpt
from neuronpack.cli._progress import ProgressMode


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
