"""The one rule for the file modes of a published artifact, whether a build made it or a pull installed it.

An artifact that another program loads in place (vLLM for nxd, tnx and vneuron artifacts: its Neuron loaders compile
*into* the directory they load from when loading fails, docs/artifacts.md) is published read-only and readable by
every user: directories 0555, files 0444, whatever the umask of the user who built or pulled it, so a pod that runs as
another, unprivileged user serves it and cannot rewrite it. A torch artifact is served by neuronpack's own runtime,
which never writes into it: it keeps the modes it was written with.

Example::

    set_published_modes(staging, "vneuron")   # every directory 0555, every file 0444
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o555
FILE_MODE = 0o444
WRITABLE_FRAMEWORKS = ("torch",)  # served by neuronpack's runtime, which writes nothing into an artifact


def read_only(framework: str) -> bool:
    """Whether an artifact of ``framework`` is published read-only."""
    return framework not in WRITABLE_FRAMEWORKS


def set_published_modes(directory: Path, framework: str) -> None:
    """Give ``directory`` (an artifact about to be published) the modes the rule asks for; deepest first, so the
    directories stay traversable until their own turn. Symlinks are left alone (an artifact holds none)."""
    if not read_only(framework):
        return
    root = Path(directory)
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True) + [root]:
        if not path.is_symlink():
            os.chmod(path, DIR_MODE if path.is_dir() else FILE_MODE)
