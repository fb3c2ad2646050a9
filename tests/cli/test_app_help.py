"""`neuronpack --help`: one line per command in the command list, the details in each command's own help."""

from __future__ import annotations

import click
import typer
from typer.testing import CliRunner

from neuronpack.cli.app import app


def _commands() -> dict[str, click.Command]:
    return typer.main.get_command(app).commands


def test_every_summary_is_one_sentence_on_one_line():
    """Docstrings used to carry hard line breaks into rich's wrapping: the list showed "...(a cache hit returns it at
    once;" and the rest of the sentence on a row of its own (compile, convert-eagle, eval, verify, gc, pull)."""
    summaries = {name: command.help.split("\n\n")[0].strip() for name, command in _commands().items()}
    assert {name: text for name, text in summaries.items() if "\n" in text or not text.endswith(".")} == {}
    shown = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["--help"]).stdout
    panel = [line for line in shown[shown.index("Commands"):].splitlines() if line.startswith("│")]
    rows = [line.strip("│ ").split(None, 1) for line in panel]
    assert [row[0] for row in rows] == list(_commands())  # no continuation row: each summary fits its one line


def test_the_details_stay_in_each_commands_own_help():
    shown = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["compile", "--help"]).stdout
    assert "A cache hit returns the artifact at once; with --remote, a key stored there is pulled" in shown
