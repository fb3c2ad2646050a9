"""bench/'s one skeleton (bench/_common.py): every benchmark builds its options with ``bench_parser`` (one spelling:
--workdir, --rounds, --threads, --model, --out; none of the retired --work / --repeat / --repeats / --name), imports
its siblings and the tests' helpers as packages (no sys.path edits), is reachable from a make target, and the plot
helpers write their PNGs."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench import _common

ROOT = Path(__file__).parents[1]
SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))
# bench/peers.py is being rewritten on its own (issue #50); it adopts the skeleton after that
ADOPTED = [p for p in SCRIPTS if p.name != "peers.py"]
RETIRED = {"--work", "--repeat", "--repeats", "--name"}


def _options(tree: ast.AST) -> set[str]:
    return {node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)}


@pytest.mark.parametrize("script", ADOPTED, ids=lambda p: p.name)
def test_every_benchmark_takes_the_shared_options_in_one_spelling(script):
    source = script.read_text()
    tree = ast.parse(source)
    calls = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert "bench_parser" in calls, "build the options with bench._common.bench_parser"
    assert not _options(tree) & RETIRED
    assert "sys.path" not in source, "import bench.* and tests.helpers.* as packages (python -m bench.NAME)"
    assert not re.search(r"^\s*from (_common|_shared_prefix|serve|decode|speculation) import", source, re.M)
    assert "matplotlib.use" not in source, "plot through bench._common.figure / save_bar_plot / save_line_plot"


def test_every_benchmark_is_reachable_from_a_make_target():
    makefile = (ROOT / "Makefile").read_text()
    listed = set()
    for name in ("BENCH", "BENCH_MORE"):
        match = re.search(rf"^{name} = ((?:.*\\\n)*.*)$", makefile, re.M)
        listed |= set(match.group(1).replace("\\\n", " ").split())
    own_targets = set(re.findall(r"-m bench\.(\w+)|bench/(\w+)\.py --", makefile))
    reachable = listed | {name for pair in own_targets for name in pair if name}
    assert {p.stem for p in SCRIPTS} <= reachable
    assert "bench-%:" in makefile and "bench-all:" in makefile and "help:" in makefile


def test_the_parser_defaults_follow_the_one_temp_dir_rule():
    args = _common.bench_parser("decode", "doc", model="smollm2", rounds=3, threads=None, out=True).parse_args([])
    assert args.workdir == Path(tempfile.gettempdir()) / "neuronpack-bench-decode"
    assert (args.rounds, args.threads, args.model, args.out) == (3, None, None, "decode")
    bare = _common.bench_parser("eagle", "doc").parse_args(["--workdir", "/x"])
    assert vars(bare) == {"workdir": Path("/x")}
    with pytest.raises(SystemExit):
        _common.bench_parser("int8_rows", "doc", model="required").parse_args([])


def test_the_plot_helpers_write_their_pngs(tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "OUT_DIR", tmp_path)
    bar = _common.save_bar_plot("bars", ["a", "b"], [1.0, 2.5], ylabel="ms", title="t")
    line = _common.save_line_plot("lines", [0, 1, 2], {"used": [1, 3, 2]}, xlabel="s", ylabel="MiB", title="t",
                                  step=True, limit=(4, "budget"))
    twin = _common.save_line_plot("twin", [0, 1], {"rss": [5, 6]}, xlabel="s", ylabel="MB", title="t",
                                  right=("completions", [0, 9]))
    with _common.figure("grouped", ncols=2) as (_, (left, right)):
        _common.grouped_bars(left, ["x", "y"], {"one": [1, 2], "two": [3, 4]}, fmt="%.0f")
        right.plot([0, 1], [1, 0])
    for path in (bar, line, twin, tmp_path / "grouped.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path


def test_a_benchmark_runs_as_a_module_of_the_bench_package():
    done = subprocess.run([sys.executable, "-m", "bench.serve_memory", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--workdir" in done.stdout and "--out" in done.stdout and "--prefix-cache-memory" in done.stdout
