"""docs/bench holds one current result per bench at its top (JSON, and the plot when the bench draws one), each
recording the machine it ran on; earlier rounds' files live in docs/bench/history/; every docs/bench file the docs
cite exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
BENCH_DOCS = ROOT / "docs" / "bench"
# A citation: "docs/bench/<file>" anywhere, or a Markdown link "(bench/<file>)" from a page in docs/.
CITED = re.compile(r"docs/bench/([\w./-]+?\.(?:json|png))|\]\(bench/([\w./-]+?\.(?:json|png))\)")
# Where a bench names its output: save_results("x" / save_bar_plot("x", an --out / --name default, "x.json", a peers
# shape's output (the last field of Shape(...) in bench/_peers_inputs.py).
NAMED = re.compile(r"""save_(?:results|bar_plot)\(\s*["']([\w-]+)["']|"--(?:out|name)",\s*default="([\w-]+)"|"""
                   r"""["'/]([\w-]+)\.(?:json|png)["']|Shape\(.*,\s*"([\w.-]+)"\),?$""", re.M)


def bench_output_names() -> set[str]:
    """Every name a bench script writes under: its own file name, and the names its source gives its results."""
    names = set()
    for script in (ROOT / "bench").glob("*.py"):
        names.add(script.stem)
        for match in NAMED.finditer(script.read_text()):
            names.update(g for g in match.groups() if g)
    return names


def cited_files() -> dict[str, list[str]]:
    """docs/bench file (relative to docs/bench) -> the pages citing it."""
    cited: dict[str, list[str]] = {}
    for page in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for match in CITED.finditer(page.read_text()):
            cited.setdefault(match.group(1) or match.group(2), []).append(page.name)
    return cited


def test_every_cited_bench_file_exists():
    cited = cited_files()
    assert cited  # the docs do cite results
    missing = {name: pages for name, pages in cited.items() if not (BENCH_DOCS / name).is_file()}
    assert missing == {}


def test_the_top_of_docs_bench_holds_one_current_result_per_bench():
    names = bench_output_names()
    top = sorted(p for p in BENCH_DOCS.iterdir() if p.name != "history")
    strays = [p.name for p in top if p.is_dir() or p.suffix not in (".json", ".png") or p.stem not in names]
    assert strays == [], "earlier runs and variants (-zen5, -before, -2threads ...) belong in docs/bench/history/"
    assert [p.name for p in top if p.suffix == ".png" and not p.with_suffix(".json").is_file()] == []


def test_every_current_result_records_its_machine():
    for path in BENCH_DOCS.glob("*.json"):
        machine = json.loads(path.read_text()).get("machine")
        assert isinstance(machine, dict) and machine, path.name
