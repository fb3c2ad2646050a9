"""Every module of the package holds at most 420 lines, the project's rule: a module split by what it does before it
grows past that (runtime/engine/core.py gave its decode step to decode_step.py at 436)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "neuronpack"
LIMIT = 420


def test_no_module_is_over_the_limit():
    sizes = {str(path.relative_to(PACKAGE.parent)): len(path.read_text().splitlines())
             for path in sorted(PACKAGE.rglob("*.py"))}
    assert {name: lines for name, lines in sizes.items() if lines > LIMIT} == {}
