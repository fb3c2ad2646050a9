"""Where artifacts live and how they appear there: the root, per-key locks, staging, atomic publish, failed builds.

Layout under a root::

    <root>/neuron-compiled-artifacts/<key>/          published artifacts (valid only with neuronpack.json)
    <root>/neuron-compiled-artifacts/.staging/       builds in progress (same filesystem, so publish is a rename)
    <root>/neuron-compiled-artifacts/.locks/<key>    per-key flock files (released by the kernel if a builder dies)
    <root>/neuron-compiled-artifacts/.failed/        logs of failed builds (never block a retry)
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from neuronpack.artifacts.modes import set_published_modes
from neuronpack.fsutil import make_staging_dir, move_into_place, write_text_atomic

ARTIFACTS_DIRNAME = "neuron-compiled-artifacts"
ROOT_ENV = "NEURONPACK_ARTIFACTS_ROOT"


def artifacts_root(root: Path | None = None) -> Path:
    """The directory holding ``neuron-compiled-artifacts/``: the given root, else $NEURONPACK_ARTIFACTS_ROOT, else
    the current directory."""
    base = root if root is not None else Path(os.environ.get(ROOT_ENV) or ".")
    return Path(base).expanduser().absolute() / ARTIFACTS_DIRNAME


def hidden_dir(store_or_parent: Path, name: str) -> Path:
    path = store_or_parent / f".{name}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def key_lock(lock_dir: Path, name: str, *, on_wait=None) -> Iterator[None]:
    """Exclusive per-key lock. Concurrent builders of one key wait here; the kernel drops the lock when its holder
    dies (even by SIGKILL), so a killed build never blocks the next one."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def new_staging(parent: Path, key: str) -> Path:
    """An empty staging directory on the same filesystem as ``parent`` (so publishing is one rename)."""
    return make_staging_dir(hidden_dir(parent, "staging"), f"{key[:16]}-{os.getpid()}-")


def publish(staging: Path, final: Path, *, framework: str, replace: bool = False) -> Path:
    """Make ``staging`` visible as ``final`` in one rename after fsyncing its content (manifest already written),
    with the modes of artifacts/modes.py's rule for ``framework`` (the same for a build and a pull; `gc` and
    `--force` still remove a read-only artifact)."""
    set_published_modes(staging, framework)
    return move_into_place(staging, final, replace=replace)


def record_failure(parent: Path, key: str, message: str, log: str) -> Path | None:
    """Keep a failed build's log; it never blocks a retry and `neuronpack gc` removes it. Best effort: None when the
    log cannot be written (the disk that failed the build is often full), so the build's own error is what surfaces."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    try:
        path = hidden_dir(parent, "failed") / f"{key[:16]}-{stamp}-{os.getpid()}.log"
        write_text_atomic(path, f"key: {key}\nerror: {message}\n\n{log}")
    except OSError:
        return None
    return path
