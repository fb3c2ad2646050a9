"""Every install instruction installs this project: its distribution name is free on PyPI, where `neuronpack`
(1.0.1) is an unrelated project, so no page, workflow or Makefile line may `pip install neuronpack`."""

from __future__ import annotations

import re
import shlex
import sys

from tests.docs.doc_examples import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

DISTRIBUTION = "neuronpack-aot"
_PIP_INSTALL = re.compile(r"pip\s+install\s+([^\n`&|;#)]*)")
_REQUIREMENT_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


def _install_lines():
    files = [REPO / "README.md", REPO / "Makefile", *sorted((REPO / "docs").glob("*.md"))]
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in _PIP_INSTALL.finditer(line):
                yield f"{path.relative_to(REPO)}:{number}", match.group(1)


def _names(arguments: str) -> list[str]:
    try:
        words = shlex.split(arguments)
    except ValueError:
        words = arguments.split()
    names = []
    for word in words:
        match = _REQUIREMENT_NAME.match(word.strip("\"'"))
        if not word.startswith("-") and match and not word.startswith((".", "/")):
            names.append(re.sub(r"[-_.]+", "-", match.group(1)).lower())
    return names


def test_the_distribution_name_is_this_projects():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION
    # the dev extra pulls the eval clients through the project's own name
    assert f"{DISTRIBUTION}[eval-clients]" in project["optional-dependencies"]["dev"]


def test_no_install_line_names_the_other_projects_package():
    lines = list(_install_lines())
    assert any(DISTRIBUTION in arguments or arguments.strip().startswith(".") for _, arguments in lines)
    wrong = [f"{where}: pip install {arguments.strip()}"
             for where, arguments in lines if "neuronpack" in _names(arguments)]
    assert not wrong, "installs PyPI's unrelated `neuronpack`, not this project:\n" + "\n".join(wrong)


def test_the_check_reads_install_lines():
    assert _names("neuronpack==1.0.1 torch") == ["neuronpack", "torch"]
    assert _names("-e .[dev]") == []
    assert _names("neuronpack-aot") == ["neuronpack-aot"]
