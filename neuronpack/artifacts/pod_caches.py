"""The writable directories a pod keeps beside a read-only artifact: ``$TMPDIR/neuronpack-vllm/<key>``, the
``VLLM_CACHE_ROOT`` a vneuron artifact is served with (backends/vneuron/launch.py). Its ``neuron/compile_cache`` is
made anew from the artifact at every start (backends/vneuron/pod.py); what vLLM keeps beside it (0.29's Precompile
Cache) lasts as long as the artifact does.

While a pod runs it holds a shared lock on ``<dir>/.neuronpack-pod.lock`` (the kernel drops it when the pod dies,
even by SIGKILL) and ``<dir>/.neuronpack-pod.json`` names the artifact it serves. ``neuronpack gc`` removes such a
directory when no pod holds it and its artifact is gone or removed by the same gc (``unused_pod_caches``); a
directory without a record (an older neuronpack's) goes once unused. Removal takes the lock exclusively and renames
the directory away first, so a pod starting meanwhile waits, then finds its lock file gone and makes a fresh one.

Example::

    with pod_cache_in_use(pod_cache_base(key), artifact_dir) as base:   # the pod's whole run
        ...
    unused_pod_caches(gone={artifact_dir})     # [(Path(".../neuronpack-vllm/<key>"), "its artifact ... is gone")]
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from neuronpack.fsutil import make_staging_dir, remove_dead_staging, remove_tree, write_text_atomic

POD_CACHES = "neuronpack-vllm"
LOCK = ".neuronpack-pod.lock"
RECORD = ".neuronpack-pod.json"
TRASH = "gc-"  # the staging label of a removal in progress (a killed gc's is removed by the next)


def pod_cache_base(key: str) -> Path:
    """The pod's writable ``VLLM_CACHE_ROOT`` for artifact ``key``: one per key under the temporary directory."""
    return pod_caches_root() / key


def pod_caches_root() -> Path:
    return Path(tempfile.gettempdir()) / POD_CACHES


@contextlib.contextmanager
def pod_cache_in_use(base: Path, artifact: Path) -> Iterator[Path]:
    """Hold ``base`` for a pod serving ``artifact`` (created if need be; the record names the artifact)."""
    base = Path(base)
    fd = _locked(base, fcntl.LOCK_SH)
    try:
        write_text_atomic(base / RECORD, json.dumps({"artifact": str(Path(artifact).absolute())}) + "\n")
        yield base
    finally:
        os.close(fd)  # releases the lock


def unused_pod_caches(gone: Callable[[Path], bool], root: Path | None = None) -> list[tuple[Path, str]]:
    """The pod caches under ``root`` (default: this machine's) that no pod holds and whose artifact ``gone`` says is
    gone (it is given the recorded artifact path), with the reason; directories without a record count as gone."""
    root = pod_caches_root() if root is None else Path(root)
    remove_dead_staging(root, TRASH)
    found = []
    for base in sorted(root.iterdir()) if root.is_dir() else ():
        if base.name.startswith(".") or not base.is_dir() or _held(base):
            continue
        artifact = _recorded_artifact(base)
        if artifact is None:
            found.append((base, "a pod cache without a record of its artifact (an older neuronpack's), unused"))
        elif gone(artifact):
            found.append((base, f"its artifact {artifact} is gone, and no pod uses it"))
    return found


def remove_pod_cache(base: Path) -> bool:
    """Remove ``base`` unless a pod holds it (then False). The directory is renamed away under the exclusive lock,
    so a pod that starts meanwhile waits and then makes its own."""
    base = Path(base)
    lock = base / LOCK
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        return True  # already gone
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        trash = make_staging_dir(base.parent, f"{TRASH}pid{os.getpid()}-")
        os.rename(base, trash / base.name)
    finally:
        os.close(fd)
    remove_tree(trash)
    return True


# --- private ---------------------------------------------------------------------------------------------------------
def _locked(base: Path, mode: int) -> int:
    """A descriptor of ``base``'s lock file holding ``mode``; retried when a gc renamed the directory away while we
    waited (the lock we got then belongs to a removed file)."""
    while True:
        try:
            base.mkdir(parents=True, exist_ok=True)
            fd = os.open(base / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except (FileExistsError, FileNotFoundError):  # renamed away while mkdir looked, or before the open
            continue
        fcntl.flock(fd, mode)
        try:
            if os.stat(base / LOCK).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _held(base: Path) -> bool:
    """Whether a pod holds ``base`` now (its lock file cannot be taken exclusively)."""
    try:
        fd = os.open(base / LOCK, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _recorded_artifact(base: Path) -> Path | None:
    try:
        record = json.loads((base / RECORD).read_text())
    except (OSError, ValueError):
        return None
    artifact = record.get("artifact") if isinstance(record, dict) else None
    return Path(artifact) if isinstance(artifact, str) else None
