"""The worked examples of README.md and docs/*.md, parsed by sybil and run as tests (tests/docs/test_doc_examples.py).

A page's fenced blocks are examples when their language is ``console`` (``$ `` lines are commands, the lines after one
are the output the page shows), ``bash`` / ``sh`` (a script) or ``python`` (run, or a doctest with ``>>>``). A block
that cannot run here carries a marker on the line before it, with its reason, which the test reports as a skip::

    <!-- skip: next "needs a Neuron device" -->

Shown output is compared after normalising what differs between runs and machines (keys and other hex runs, numbers,
times, absolute paths, spacing, the width of table rules); ``...`` in a shown line matches anything. A JSON object
shown is compared by its keys, at every depth where the page shows a dict. A block whose output is machine-specific
says so with ``<!-- output: not compared "reason" -->`` on the line before it (the commands still run). A console
block of output only, right after a Python example, is what that example prints. A page's server runs in the
background of its shell and is stopped by the page; what a page leaves running ends with the session.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sybil import Example, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

REPO = Path(__file__).resolve().parents[2]
_NOT_COMPARED = re.compile(r'<!--\s*output:\s*not compared\s+"([^"]+)"\s*-->\s*$')
# what differs between runs and machines, normalised away before comparing (numbers included: a figure the page
# shows stands for the shape of the line, not its value)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?")
_HEX = re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{7,}\b")
_PATH = re.compile(r"(?<![\w.])(?:/[^\s/\"',:()]+)+/?")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_RULE = re.compile(r"([━─═])\1+")


_DONE = "__neuronpack_doc_step_done__"
_PRINTED = "__neuronpack_python_printed__"
_MEMOISED = ("neuronpack import-gguf ", "neuronpack compile ", "neuronpack quantize ")


@dataclass
class Workspace:
    """Where the pages' commands run: one bash process per page in the workspace directory (so a variable or `cd` of
    one command holds for the next, as in a reader's shell), the environment, and the session's command memo."""

    cwd: Path
    env: dict[str, str]
    memo: dict[str, tuple[int, str]] = field(default_factory=dict)
    shells: dict[str, subprocess.Popen] = field(default_factory=dict)
    _lines: dict[str, queue.Queue] = field(default_factory=dict)

    def run(self, command: str, page: str = "", timeout: float = 600) -> tuple[int, str]:
        """One command in the page's shell: (exit code, stdout and stderr merged in order). An import, compile or
        quantize already run in the session is answered from the memo (the pages share the first import of SmolLM2
        and its compile, as a reader's one shell would: the same inputs give the same result); every other command,
        an assignment, `cd` or a check such as `verify`, always runs."""
        memoisable = command.startswith(_MEMOISED)
        if memoisable and command in self.memo:
            return self.memo[command]
        shell = self.shells.get(page)
        if shell is None:
            shell = self.shells[page] = subprocess.Popen(
                ["bash", "--noprofile", "--norc"], cwd=self.cwd, env=self.env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
            # a thread reads the shell's output into a queue: a timeout without select() on a buffered pipe
            self._lines[page] = queue.Queue()
            threading.Thread(target=_pump, args=(shell.stdout, self._lines[page]), daemon=True).start()
        # the exit code is kept for the page's next command (`echo $?`)
        # stdin is /dev/null: the shell reads its commands from its own stdin, which a command must not consume
        shell.stdin.write(f"{{ {command}\n}} </dev/null\n__np_rc=$?; echo; echo {_DONE} $__np_rc; (exit $__np_rc)\n")
        shell.stdin.flush()
        lines, deadline = [], time.monotonic() + timeout
        while True:
            try:
                line = self._lines[page].get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"`{command}` ran over {timeout} s") from None
            if line is None:
                raise AssertionError(f"the shell ended during `{command}`:\n{''.join(lines)}")
            if line.startswith(_DONE):
                break
            lines.append(line)
        output = "".join(lines)[:-1]  # less the newline echoed before the marker (it ends an unfinished last line)
        result = (int(line.split()[1]), output)
        if memoisable:
            self.memo[command] = result
        return result

    def close(self) -> None:
        for shell in self.shells.values():
            end_page_shell(shell)


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def normalise(line: str) -> str:
    line = _ANSI.sub("", line)
    line = _TIMESTAMP.sub("T", line)
    line = _HEX.sub("H", line)
    line = _PATH.sub("P", line)
    line = _NUMBER.sub("N", line)
    line = _RULE.sub(r"\1", line)
    return " ".join(line.split())


def _line_pattern(shown: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in normalise(shown).split("...")))


def compare_text(shown: list[str], actual: str) -> str | None:
    """None when every shown line (normalised) matches an actual line, in order; else what is missing."""
    lines = [normalise(a) for a in actual.splitlines()]
    position = 0
    for text in shown:
        if not text.strip():
            continue
        pattern = _line_pattern(text)
        found = next((i for i in range(position, len(lines)) if pattern.fullmatch(lines[i])), None)
        if found is None:
            return f"the page shows {text.strip()!r} (normalised {normalise(text)!r}); not in the output"
        position = found + 1
    return None


def _shown_json(shown: list[str]) -> object | None:
    text = "\n".join(shown).strip()
    if not text.startswith("{"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def compare_keys(shown: object, actual: object, where: str = "") -> str | None:
    """None when every dict the page shows has exactly the keys of the actual one, at every depth it shows."""
    if isinstance(shown, dict):
        if not isinstance(actual, dict):
            return f"{where or 'the object'}: the page shows an object, the command gives {type(actual).__name__}"
        if set(shown) != set(actual):
            return (f"{where or 'the object'}: keys the page shows but the command does not give: "
                    f"{sorted(set(shown) - set(actual))}; given but not shown: {sorted(set(actual) - set(shown))}")
        for key, value in shown.items():
            problem = compare_keys(value, actual[key], f"{where}.{key}")
            if problem:
                return problem
    return None


def _last_json_object(output: str) -> object | None:
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def split_console(source: str) -> list[tuple[str, list[str]]]:
    """A console block as (command, the output lines shown after it); ``\\`` or an open quote continues a command
    on the next line, as in a reader's shell."""
    steps: list[tuple[str, list[str]]] = []
    pending: str | None = None
    for line in source.splitlines():
        if pending is not None:
            pending += "\n" + line
            if not line.endswith("\\") and not unclosed_quote(pending):
                steps.append((pending, []))
                pending = None
        elif line.startswith("$ "):
            if line.endswith("\\") or unclosed_quote(line[2:]):
                pending = line[2:]
            else:
                steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def _not_compared_reason(example: Example) -> str | None:
    before = example.document.text[: example.start].rstrip("\n").rsplit("\n", 1)[-1]
    match = _NOT_COMPARED.search(before)
    return match.group(1) if match else None


def evaluate_console(example: Example) -> None:
    workspace: Workspace = example.namespace["workspace"]
    compare = _not_compared_reason(example) is None
    steps = split_console(example.parsed)
    if not steps and compare:  # output only: what the Python example just before it prints
        return compare_printed(example)
    for command, shown in steps:
        returncode, output = workspace.run(command, example.path)
        expect_error = any(text.startswith("error:") for text in shown)  # after the info lines a failure prints
        where = f"{example.path}:{example.line}: `{command}`"
        if (returncode != 0) != expect_error:
            raise AssertionError(f"{where} exited {returncode}:\n{output[-3000:]}")
        if not compare or not shown:
            continue
        page_json = _shown_json(shown)
        if page_json is not None:
            actual = _last_json_object(output)
            problem = compare_keys(page_json, actual) or compare_figures(page_json, actual)
        else:
            problem = compare_text(shown, output)
        if problem:
            raise AssertionError(f"{where}: {problem}\n--- output ---\n{output[-3000:]}")


def evaluate_script(example: Example) -> None:
    workspace: Workspace = example.namespace["workspace"]
    returncode, output = workspace.run(example.parsed, example.path)
    if returncode != 0:
        raise AssertionError(f"{example.path}:{example.line} exited {returncode}:\n{output[-3000:]}")


def _fail_unmarked(example: Example) -> None:
    raise AssertionError(f"{example.path}:{example.line}: a {example.region.lexemes.get('arguments')} block is not run "
                         "here: mark it <!-- skip: next \"reason\" --> or make it a console / python example")


class PrintingPythonEvaluator(PythonEvaluator):
    """Runs a Python example and keeps what it printed, for the output-only console block that may follow it."""

    def __call__(self, example: Example) -> None:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            super().__call__(example)
        example.namespace[_PRINTED] = (example.end, printed.getvalue())


class PrintingPythonParser(PythonCodeBlockParser):
    def __init__(self) -> None:
        super().__init__()
        self.codeblock_parser = self.codeblock_parser_class("python", PrintingPythonEvaluator())


SYBIL = Sybil(parsers=[
    SkipParser(),
    PrintingPythonParser(),
    CodeBlockParser("console", evaluate_console),
    CodeBlockParser("bash", evaluate_script),
    CodeBlockParser("sh", evaluate_script),
])


def page_examples(page: Path) -> list[Example]:
    """The examples of one page in order (skip markers included: they must be evaluated to take effect)."""
    return list(SYBIL.parse(page))


def command_env(cache_dir: Path) -> dict[str, str]:
    """What a reader's shell has after `make install`: the venv's bin on PATH, this checkout importable."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({"NEURONPACK_CACHE_DIR": str(cache_dir), "COLUMNS": "120", "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false", "NO_COLOR": "1"})
    for name in ("NEURON_COMPILED_ARTIFACTS", "NEURONPACK_FRAMEWORK", "VLLM_NEURON_FRAMEWORK",
                 "NEURONPACK_ARTIFACTS_ROOT", "NEURONPACK_REMOTE"):
        env.pop(name, None)
    return env



def end_page_shell(shell: subprocess.Popen, grace: float = 30) -> None:
    """End a page's shell and whatever it left running (a server it started in the background and did not stop, e.g.
    after a failed step): the shell leads its own process group, which its background jobs stay in, so SIGTERM to
    the group reaches them (a server drains and exits 0), and SIGKILL after ``grace`` seconds."""
    try:
        shell.stdin.close()
    except BrokenPipeError:
        pass
    try:
        shell.wait(timeout=2)
    except subprocess.TimeoutExpired:  # stuck in a command (an unfinished quote, a hung step)
        pass
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        try:
            os.killpg(shell.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            shell.poll()  # reaps the shell itself: a zombie leader would keep the group alive
            try:
                os.killpg(shell.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)



FIGURE_DECIMALS = 4  # what every command rounds a figure to at most (timings, ratios), unless the page shows more


def _decimals(value: float) -> int | None:
    text = repr(value)
    return None if "e" in text or "." not in text else len(text.split(".")[1].rstrip("0"))


def compare_figures(shown: object, actual: object, where: str = "") -> str | None:
    """None when no float of the output has more than FIGURE_DECIMALS decimals where the page shows a figure
    rounded to at most that many: an unrounded figure such as ``2.6666666666666665`` is a finding, whatever its
    value."""
    if isinstance(shown, dict) and isinstance(actual, dict):
        pairs = [(f"{where}.{key}", shown[key], actual[key]) for key in shown if key in actual]
    elif isinstance(shown, list) and isinstance(actual, list):
        pairs = [(f"{where}[{i}]", a, b) for i, (a, b) in enumerate(zip(shown, actual, strict=False))]
    elif isinstance(shown, (int, float)) and isinstance(actual, float) and not isinstance(shown, bool):
        # a page that shows more decimals shows a value sent at full precision (an API's logprob)
        rounded = (_decimals(float(shown)) or 0) <= FIGURE_DECIMALS
        digits = _decimals(actual)
        if rounded and digits is not None and digits > FIGURE_DECIMALS:
            return f"{where or 'the figure'}: {actual!r} is printed unrounded (the page shows {shown!r})"
        return None
    else:
        return None
    return next((problem for w, a, b in pairs if (problem := compare_figures(a, b, w))), None)


def unclosed_quote(command: str) -> bool:
    """Whether a shell command ends inside a quote (bash then reads on): '...' escapes nothing, "..." and bare words
    take a backslash escape, and a ``#`` starting a word comments out the rest of the line."""
    quote, escaped, comment = None, False, False
    previous = " "
    for char in command:
        if comment:
            comment = char != "\n"
        elif escaped:
            escaped = False
        elif quote == "'":
            quote = None if char == "'" else quote
        elif char == "\\":
            escaped = True
        elif quote == '"':
            quote = None if char == '"' else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and previous.isspace():
            comment = True
        previous = char
    return quote is not None


def compare_printed(example: Example) -> None:
    """A console block of output only, right after a Python example (prose between them, no other block), shows what
    that example printed: compared as a command's output is. Anywhere else it is an illustration, not compared."""
    end, printed = example.namespace.get(_PRINTED, (None, ""))
    if end is None or "```" in example.document.text[end:example.start]:
        return
    problem = compare_text(example.parsed.splitlines(), printed)
    if problem:
        raise AssertionError(f"{example.path}:{example.line}: {problem}\n--- printed ---\n{printed[-3000:]}")
