"""`--progress plain` (the default off a terminal, i.e. in CI logs) renders every kind of task."""

from __future__ import annotations

import io

from rich.console import Console

from neuronpack.cli._progress import PlainTask


def _lines(total, unit=None) -> list[str]:
    out = io.StringIO()
    with PlainTask(Console(file=out, width=200), "NxDI compile (llama, tp 8)", total, unit):
        pass
    return out.getvalue().splitlines()


def test_a_task_without_a_total_starts_and_ends():
    # Regression: a task with total=None (the NxDI compile stage) raised TypeError from f"{None:g}".
    lines = _lines(None)
    assert lines[0].endswith("NxDI compile (llama, tp 8): started")
    assert "NxDI compile (llama, tp 8): done in" in lines[1]


def test_a_counted_task_names_its_size():
    assert _lines(12)[0].endswith("started (12 steps)")
