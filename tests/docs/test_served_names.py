"""The model names the client examples of docs/serve.md (and the other pages that talk to a server) send are names
the server of the page serves: a shipped recipe's `name` (the default served name) or one the page gives with
`--served-model-name` / `--lora` (a 404 otherwise, as `model="smollm2"` was)."""

from __future__ import annotations

import re
import sys

import pytest

from tests.docs.doc_examples import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

PAGES = ["docs/serve.md", "docs/lora.md", "docs/speculation.md", "docs/generate.md"]
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_SENT = re.compile(r"""(?:\bmodel=|["']model["']\s*:\s*)["']([^"'$]+)["']""")
# --served-model-name, and LoRA adapters (each is served under its name): --lora NAME=DIR, name = "NAME" in a recipe
_GIVEN = re.compile(r"--served-model-name\s+([\w.-]+)|--lora\s+([\w.-]+)=|\bname\s*=\s*\"([\w.-]+)\"")


def _recipe_names() -> set[str]:
    """Each shipped recipe's name and its LoRA adapters' names (served under their own names)."""
    names = set()
    for path in (REPO / "recipes").glob("*.toml"):
        recipe = tomllib.loads(path.read_text())
        names.add(recipe.get("name", path.stem))
        names.update(adapter["name"] for adapter in recipe.get("lora", {}).get("adapters", []))
    return names


@pytest.mark.parametrize("page", PAGES)
def test_client_examples_name_a_served_model(page):
    text = (REPO / page).read_text()
    blocks = _FENCE.findall(text)
    given = {name for match in _GIVEN.finditer(text) for name in match.groups() if name}
    known = _recipe_names() | given
    # a block that shows the 404 of an unknown name sends it on purpose
    sent = {name for block in blocks for name in _SENT.findall(block) if f"`{name}` does not exist" not in block}
    unknown = sorted(sent - known)
    assert not unknown, f"{page}: examples send model names no server of the page serves: {unknown}"
