"""Untrusted artifacts: the paths a manifest names must stay inside the artifact directory.

An artifact may come from elsewhere (a shared root, a copy, `pull`), so its manifest is input like any other. Every
file it lists must be a plain relative path below the directory: not absolute, no ``..`` (or ``.``, empty or NUL)
component, and no symlink anywhere on the way. Symlinks are refused outright, wherever they point and whether or not
the manifest lists them: neuronpack never writes one (publish copies real files), so a symlink means the directory
was changed after the build, and a link to a file outside would make verify hash, and serve load, bytes the artifact
does not own.

``member_path`` is the one check; verify (quick and full), serve's loading path (through verify) and pull use it.

Example::

    member_path(Path("art"), "weights/model.safetensors")   # Path("art/weights/model.safetensors")
    member_path(Path("art"), "../secrets")                  # ArtifactError: ... escapes the artifact
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from neuronpack.errors import ArtifactError

FIX = "do not use this artifact: rebuild it with `neuronpack compile`, or fetch it again from a trusted source"


def member_path(artifact_dir: Path, rel: str) -> Path:
    """The file ``rel`` (a manifest entry) inside ``artifact_dir``; ArtifactError if the name could escape it."""
    root = Path(artifact_dir)
    problem = _name_problem(rel)
    if problem:
        raise ArtifactError(f"manifest file name {rel!r} {problem}", where=str(root), fix=FIX)
    path = root
    for part in PurePosixPath(rel).parts:
        path = path / part
        if path.is_symlink():
            raise ArtifactError(f"{path.relative_to(root).as_posix()} is a symlink (to {os.readlink(path)!r}); "
                                "artifacts hold no symlinks", where=str(root), fix=FIX)
    return path


def check_no_symlinks(artifact_dir: Path) -> None:
    """No symlink anywhere below ``artifact_dir`` (listed in the manifest or not)."""
    root = Path(artifact_dir)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                raise ArtifactError(f"{path.relative_to(root).as_posix()} is a symlink (to {os.readlink(path)!r}); "
                                    "artifacts hold no symlinks", where=str(root), fix=FIX)


def _name_problem(rel: object) -> str | None:
    if not isinstance(rel, str) or not rel:
        return "is empty"
    if "\x00" in rel or "\\" in rel:
        return "holds a NUL or backslash"
    if rel.startswith("/") or PurePosixPath(rel).is_absolute():
        return "is an absolute path: it escapes the artifact"
    parts = rel.split("/")
    if ".." in parts:
        return "has a '..' component: it escapes the artifact"
    if any(p in ("", ".") for p in parts):
        return "is not a normalized relative path"
    return None
