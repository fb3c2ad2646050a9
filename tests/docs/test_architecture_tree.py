"""docs/architecture.md is true to the code where a machine can tell: its package tree names only files and folders
that exist and every module of the package under its own package's entry, its tree of the checkout names every
benchmark and tool, and the arrows of its layer diagram are exactly the imports the packages make of each other (the
order itself is import-linter's contract)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.doc_examples import REPO

PAGE = REPO / "docs/architecture.md"
SOURCES = ("*.py", "*.cpp", "*.h", "*.c")
NOT_NAMED = {"__init__.py", "__main__.py"}  # a package's own file: its entry names what it exports where it matters


def _block(start: str) -> str:
    blocks = re.findall(rf"```\n({re.escape(start)}.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) == 1, f"docs/architecture.md should hold one tree starting with {start!r}"
    return blocks[0]


def _entries(tree: str) -> dict[str, str]:
    """Top-level entry ("cli", "runtime", ... ; "" for the modules at the package's root) -> its text."""
    entries: dict[str, str] = {}
    name = ""
    for line in tree.splitlines()[1:]:
        match = re.match(r"  ([a-z_0-9]+)/ ", line)
        if match:
            name = match.group(1)
        elif re.match(r"  [a-z_]+\.py", line):
            name = ""
        entries[name] = entries.get(name, "") + line + "\n"
    return entries


def _sources(directory: Path) -> list[Path]:
    return sorted(p for pattern in SOURCES for p in directory.rglob(pattern)
                  if "__pycache__" not in p.parts and p.name not in NOT_NAMED)


def _named(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text) is not None


def test_every_file_and_folder_the_tree_names_exists():
    tree = _block("neuronpack/\n")
    package = REPO / "neuronpack"
    present = {p.name for p in package.rglob("*") if "__pycache__" not in p.parts} | {p.name for p in REPO.iterdir()}
    files = set(re.findall(r"\b([a-z_0-9]+\.(?:py|cpp|h|c))\b", tree))
    folders = set(re.findall(r"(?<![\w/.])([a-z_0-9]+)/(?![\w<])", tree)) - {"neuronpack"}
    assert len(files) > 50 and len(folders) > 10  # the tree was read
    assert not sorted(files - present), "named in the tree but not in the package"
    directories = {p.name for p in package.rglob("*") if p.is_dir()}
    assert not sorted(folders - directories), "folders named in the tree but not in the package"


def test_every_module_is_named_under_its_package():
    entries = _entries(_block("neuronpack/\n"))
    package = REPO / "neuronpack"
    missing = []
    for path in _sources(package):
        parts = path.relative_to(package).parts
        text = entries.get(parts[0] if len(parts) > 1 else "", "")
        if not _named(text, path.name):
            missing.append("/".join(parts))
    assert missing == [], "modules docs/architecture.md's package tree does not name (under their package's entry)"


def test_every_benchmark_and_tool_is_named_in_the_checkout_tree():
    sections = dict(re.findall(r"^([a-z]+)/ (.*?)(?=^[a-z]+/ |\Z)", _block("bench/ "), flags=re.M | re.S))
    assert set(sections) == {"bench", "tests", "tools"}
    for folder in ("bench", "tools"):
        names = {p.name for p in _sources(REPO / folder)}
        assert sorted(n for n in names if not _named(sections[folder], n)) == [], f"{folder}/ files the tree misses"
        named = set(re.findall(r"\b([a-z_0-9]+\.py)\b", sections[folder]))
        assert sorted(named - names) == [], f"named under {folder}/ but not there"


def _diagram_arrows() -> set[tuple[str, str]]:
    diagram = re.search(r"## Layers.*?```mermaid\n(.*?)```", PAGE.read_text(), flags=re.S).group(1)
    arrows = set()
    for left, right in re.findall(r"^\s*([\w &]+?)\s*-->\s*([\w &]+?)\s*$", diagram, flags=re.M):
        arrows |= {(a.strip(), b.strip()) for a in left.split("&") for b in right.split("&")}
    return arrows


def test_the_layer_diagrams_arrows_are_the_imports_between_packages():
    import grimp

    boxes = {"cli", "pipeline", "runtime", "planner", "accuracy", "backends", "artifacts", "convert", "models",
             "checkpoint", "kernels"}
    graph = grimp.build_graph("neuronpack", include_external_packages=False)
    imports = set()
    for module in graph.modules:
        source = module.split(".")[1] if "." in module else None
        for imported in graph.find_modules_directly_imported_by(module):
            target = imported.split(".")[1] if "." in imported else None
            if source in boxes and target in boxes and source != target:
                imports.add((source, target))
    drawn = {(a, b) for a, b in _diagram_arrows() if b != "base"}
    assert {a for a, _ in _diagram_arrows() if _ == "base"} == {"checkpoint", "kernels"}
    assert sorted(imports - drawn) == [], "imports between packages the diagram does not draw"
    assert sorted(drawn - imports) == [], "arrows of the diagram no import makes"
