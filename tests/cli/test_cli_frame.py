"""The CLI frame: version, one-line errors, debug tracebacks, torch-free start, buckets."""

import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from neuronpack import __version__
from neuronpack.cli.app import app
from tests.helpers.fresh_interpreter import run_fresh

runner = CliRunner(env={"COLUMNS": "120"})


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"neuronpack {__version__}"


def test_cli_start_and_buckets_do_not_import_torch():
    code = (
        "import sys\n"
        "from neuronpack.cli.app import app\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(app, ['buckets', '--seq-len', '4096', '--format', 'json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "r = CliRunner().invoke(app, ['--version'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))\n"
    )
    out, torch_imported = run_fresh(code)
    assert out == "[]" and not torch_imported


def test_a_command_imports_only_its_own_module():
    """``neuronpack <command>`` (the entry point, ``main``) imports that command's modules and no other (a command
    group's: ``buckets`` and its ``plan`` subcommand, whose options typer builds with the group); the full app
    (``--help``, an unknown command) has every command."""
    code = (
        "import sys\n"
        "from neuronpack.cli.app import main\n"
        "sys.argv = ['neuronpack', 'buckets', '--seq-len', '4096', '--format', 'json']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print(sorted(m for m in sys.modules if m.startswith('neuronpack.cli.') and m.endswith('_cmd')))\n"
    )
    out, _ = run_fresh(code)
    assert out.splitlines()[-1] == "['neuronpack.cli.buckets_cmd', 'neuronpack.cli.buckets_plan_cmd']"
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and all(name in result.output for name in ("compile", "convert-eagle", "pull"))


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "neuronpack", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and __version__ in out.stdout


def test_buckets_table_and_json():
    result = runner.invoke(app, ["buckets", "--seq-len", "8192"])
    assert result.exit_code == 0
    assert "128, 256, 512, 1024, 2048, 4096, 8192" in result.output
    result = runner.invoke(app, ["buckets", "--seq-len", "1024", "--max-context-length", "512",
                                 "--context", "128,512", "--format", "json"])
    assert json.loads(result.stdout) == {"context": [128, 512], "token_generation": [128, 256, 512, 1024],
                                         "max_context_length": 512, "seq_len": 1024}


def test_buckets_at_80_columns_wraps_between_buckets_never_inside_one():
    args = ["buckets", "--seq-len", "1048576", "--max-context-length", "1048576"]
    table = CliRunner(env={"COLUMNS": "80"}).invoke(app, args)
    plan = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    assert table.exit_code == 0 and "…" not in table.stdout
    lines = [line for line in table.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert max(map(len, lines)) <= 80 and len(lines) > 7  # the bucket lists wrapped
    rows: list[list[str]] = []  # kind, buckets, graphs; a wrapped row's lines joined
    for line in lines:
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0]:
            rows.append(cells)
        elif cells:
            rows[-1][1] += " " + cells[1]
    for (kind, buckets, graphs), key in zip(rows, ("context", "token_generation"), strict=True):
        assert [int(b) for b in buckets.split(", ")] == plan[key] and int(graphs) == len(plan[key]), kind


def test_user_error_is_one_line_exit_1_no_traceback():
    result = runner.invoke(app, ["buckets", "--seq-len", "100", "--context", "200"])
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith("error: context bucket 200 is larger than its maximum 100")
    assert "Traceback" not in result.output


def test_debug_variable_shows_the_traceback():
    env = {**os.environ, "NEURONPACK_DEBUG": "1"}
    out = subprocess.run([sys.executable, "-m", "neuronpack", "buckets", "--seq-len", "100", "--context", "200"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 1 and "Traceback" in out.stderr and "BucketError" in out.stderr


def test_usage_error_exit_2():
    result = runner.invoke(app, ["buckets"])
    assert result.exit_code == 2


def test_help_keeps_bracketed_names():
    """Rich markup would swallow an unescaped "[speculation]" in an option's help (`generate --help` lost it): every
    bracketed name in a help text is escaped, and the rendered help shows it."""
    import re

    import typer

    def commands(command):
        yield command
        for sub in getattr(command, "commands", {}).values():
            yield from commands(sub)

    unescaped = [f"{command.name} {param.name}: {param.help}"
                 for command in commands(typer.main.get_command(app)) for param in command.params
                 if re.search(r"(?<!\\)\[[a-z][a-z_.]*\]", getattr(param, "help", None) or "")]
    assert not unescaped
    result = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "compiled with [speculation]" in result.output
