"""Package attributes imported on first use (PEP 562), so that importing a package stays cheap.

A package's ``__init__`` that re-exports names from its submodules would import all of them, and every command
would pay for modules it never runs. The CLI start and a cache-hit ``neuronpack compile`` import only what they use.

Example::

    # neuronpack/checkpoint/__init__.py
    __getattr__ = lazy_attributes(__name__, {"open_checkpoint": "reader", "import_gguf": "gguf_import"})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps an attribute name to the submodule (relative to the
    package) that defines it, imported on the first access of the name. Unknown names raise AttributeError, so
    ``from package import submodule`` still imports the submodule."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
