"""``LazyConsole.line``: info lines, warnings and errors print exactly what rich prints, without importing rich where
rich would print the characters unchanged (not a terminal)."""

import io
import os
import subprocess
import sys

import pytest
from rich.console import Console
from rich.markup import escape

from neuronpack.cli._console import LazyConsole

MESSAGES = [
    "cast lm_head.weight F32 -> BF16: the target's dtype differs from the draft's BF16 (--dtype auto keeps it)",
    "remove [speculation] from the recipe",  # brackets are not markup
    "[bold]not bold[/]",
    "a path: /tmp/x y/model.safetensors (fix: pass --out)",
    "emoji code :smile: and :thumbs_up: stay as rich renders them",
    "a:b:c",
    "backslash at the end \\",
    "escaped \\[bracket]",
    "tab\tinside",
    "bell\x07 and carriage return\r",
    "unicode é 中 😀 \u00a0 ﬀ",
    "   leading and trailing spaces   ",
    "",
    "x" * 300,  # longer than any terminal: never wrapped
]


def _rich(text: str, prefix: str, style: str) -> str:
    """What the CLI printed before ``line`` existed (the same calls, into a non-terminal stream)."""
    buf = io.StringIO()
    console = Console(file=buf, highlight=False)
    if prefix:
        console.print(f"[{style}]{escape(prefix)}[/] {escape(text)}", highlight=False, soft_wrap=True)
    else:
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    return buf.getvalue()


@pytest.mark.parametrize("text", MESSAGES)
@pytest.mark.parametrize(("prefix", "style"), [("", ""), ("warning:", "yellow"), ("error:", "bold red")])
def test_line_prints_what_rich_prints(monkeypatch, text, prefix, style):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    LazyConsole(stderr=True, highlight=False).line(text, prefix=prefix, style=style)
    assert captured.getvalue() == _rich(text, prefix, style)


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**clean, **env})


def test_a_warning_into_a_pipe_does_not_import_rich():
    code = ("import sys\n"
            "from neuronpack.cli._console import stderr\n"
            "stderr.line('the draft has no lm_head', prefix='warning:', style='yellow')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))\n")
    done = _run(code)
    assert done.stderr == "warning: the draft has no lm_head\n" and done.stdout.strip() == "[]"


def test_forced_colour_is_left_to_rich():
    code = ("from neuronpack.cli._console import stderr\n"
            "stderr.line('the draft has no lm_head', prefix='warning:', style='yellow')\n")
    done = _run(code, FORCE_COLOR="1")
    assert done.stderr.startswith("\x1b[33mwarning:\x1b[0m the draft has no lm_head")
