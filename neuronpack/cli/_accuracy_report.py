"""An accuracy report (``AccuracyReport.to_dict()``) as people and CI read it: the table and verdict, and the exit
code CI gates on. ``neuronpack eval`` prints it on stdout; ``compile --check-accuracy`` on stderr."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuronpack.cli._console import LazyConsole, cell, print_table, stdout

if TYPE_CHECKING:
    from rich.console import Console

# Exit code when the check could not run here (NxDI / TNx artifacts need a Neuron device): not a pass, not a fail.
EXIT_NOT_RUN = 3


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

    dequantized = " (dequantized)" if data.get("reference_dequantized") else ""
    table = Table(title=cell(f"{artifact} ({data['precision']}) vs {data['reference']}{dequantized}"))
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
