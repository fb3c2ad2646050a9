"""docs/architecture.md's package tree names only files and folders that exist: a module renamed, moved or removed
without the page following fails here (the layer diagram itself is checked by import-linter's contracts)."""

from __future__ import annotations

import re

from tests.docs.doc_examples import REPO


def _package_tree() -> str:
    blocks = re.findall(r"```\n(neuronpack/\n.*?)```", (REPO / "docs/architecture.md").read_text(), flags=re.S)
    assert len(blocks) == 1, "docs/architecture.md should hold one package tree starting with neuronpack/"
    return blocks[0]


def test_every_file_and_folder_the_tree_names_exists():
    tree = _package_tree()
    package = REPO / "neuronpack"
    present = {p.name for p in package.rglob("*") if "__pycache__" not in p.parts} | {p.name for p in REPO.iterdir()}
    files = set(re.findall(r"\b([a-z_0-9]+\.(?:py|cpp|h|c))\b", tree))
    folders = set(re.findall(r"(?<![\w/.])([a-z_0-9]+)/(?![\w<])", tree)) - {"neuronpack"}
    assert len(files) > 50 and len(folders) > 10  # the tree was read
    assert not sorted(files - present), "named in the tree but not in the package"
    directories = {p.name for p in package.rglob("*") if p.is_dir()}
    assert not sorted(folders - directories), "folders named in the tree but not in the package"
