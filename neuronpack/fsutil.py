"""Filesystem helpers shared by every command that writes output: atomic directories, input protection, fsync.

Rule of the house: never write into an input directory, and never leave a half-written output behind.
``atomic_output_dir`` builds in a hidden staging sibling and renames it into place only when the body succeeds.

Example::

    with atomic_output_dir(Path("out"), inputs=[model_dir]) as staging:
        (staging / "config.json").write_text("{}")
    # out/ now exists with config.json; on any exception nothing named out/ was created.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from neuronpack.errors import NeuronpackError, OutputExistsError

STAGING_PREFIX = ".neuronpack-staging-"
_STAGING_PID_RE = re.compile(r"pid(\d+)-")


def check_output_path(out: Path, *, inputs: Iterable[Path] = (), overwrite: bool = False) -> Path:
    """Refuse an output that exists (unless overwrite) or that lies inside / contains one of the inputs."""
    out = Path(out).expanduser().absolute()
    for inp in inputs:
        inp = Path(inp).expanduser().resolve()
        real_out = out.resolve()
        if real_out == inp or inp in real_out.parents or real_out in inp.parents:
            raise NeuronpackError(
                "output directory overlaps an input",
                where=f"{out} vs input {inp}",
                fix="choose an --out outside the input directories",
            )
    if out.exists() and not overwrite:
        raise OutputExistsError(
            "output already exists", where=str(out), fix="remove it or choose another --out"
        )
    return out


def fsync_tree(root: Path) -> None:
    """fsync every file and directory below root (and root itself) so a rename publishes durable content."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


class BackgroundWork:
    """A context manager over work a helper thread does for its owner: an error the thread meets is kept in
    ``_error`` and raised in the owner's thread by ``_raise_error`` (from ``close`` or the owner's next call). Leaving
    the ``with`` normally runs ``close``; leaving it with an exception runs ``_abandon`` instead, and the body's
    exception is the one the owner sees."""

    _error: BaseException | None = None

    def close(self) -> None:
        raise NotImplementedError

    def _abandon(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._abandon()


class FlushBehind(BackgroundWork):
    """Write a file's data to disk while more of it is still being written: each time ``wrote`` has counted
    ``every`` bytes, a worker thread fdatasyncs (a duplicate of) the file's descriptor, unless its previous fdatasync
    is still running. Writeback then overlaps the writing instead of following it, and the fsync before publishing
    (``fsync_tree``) finds little left to do. It changes no guarantee: the caller still fsyncs. A background
    fdatasync's error is raised by ``wrote`` or ``close`` (Linux reports a writeback error once per open file: a
    later fsync of a new descriptor would not see it).

    Example::

        with open(path, "wb") as fh, FlushBehind(fh) as flush:
            for piece in pieces:
                fh.write(piece)
                flush.wrote(len(piece))
    """

    def __init__(self, fh: BinaryIO, every: int = 16 * 2**20) -> None:
        self._fh = fh
        self._fd = os.dup(fh.fileno())
        self._every = every
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._error: OSError | None = None
        self._lock = threading.Lock()

    def wrote(self, nbytes: int) -> None:
        """Count ``nbytes`` more written; thread-safe (the writer's stored copies count from their worker)."""
        with self._lock:
            self._pending += nbytes
            if self._pending < self._every or (self._thread is not None and self._thread.is_alive()):
                return
            self._raise_error()
            self._fh.flush()  # what Python still buffers reaches the kernel before the fdatasync starts
            self._pending = 0
            self._thread = threading.Thread(target=self._sync, name="neuronpack-flush-behind", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Wait for the running fdatasync; raise its error, if any."""
        if self._thread is not None:
            self._thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._raise_error()

    def _sync(self) -> None:
        try:
            getattr(os, "fdatasync", os.fsync)(self._fd)
        except OSError as exc:
            self._error = exc


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_staging_dir(parent: Path, label: str = "") -> Path:
    """An empty hidden directory under ``parent`` with ordinary permissions (mkdtemp's 0700 would make a published
    output unreadable to the other users and pods sharing an artifact root)."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{label}", dir=parent))
    os.chmod(path, 0o777 & ~_umask())
    return path


def move_into_place(staging: Path, out: Path, *, replace: bool = False) -> Path:
    """Publish a finished staging directory as ``out`` with one rename, after fsyncing its content. An existing
    ``out`` is swapped out (replace=True) or refused (FileExistsError). ``staging`` must be on out's filesystem."""
    fsync_tree(staging)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        if not replace:
            raise FileExistsError(out)
        trash = make_staging_dir(staging.parent, "trash-")
        os.replace(out, trash / "old")
        os.replace(staging, out)
        remove_tree(trash)
    else:
        os.replace(staging, out)
    fsync_dir(out.parent)
    return out


def remove_tree(path: Path) -> None:
    """rmtree that also removes read-only trees (a published Neuron artifact, artifacts/modes.py): write bits are
    restored on directories first."""
    path = Path(path)
    if not path.exists():
        return
    for sub in [path, *path.rglob("*")]:
        if sub.is_dir() and not sub.is_symlink():
            with contextlib.suppress(OSError):
                os.chmod(sub, sub.stat().st_mode | 0o700)
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def atomic_output_dir(
    out: Path, *, inputs: Iterable[Path] = (), overwrite: bool = False, label: str = ""
) -> Iterator[Path]:
    """Yield an empty staging directory next to ``out``; publish it as ``out`` only if the body succeeds.

    The staging name carries this process's pid; staging directories of the same label left by processes that died
    (SIGKILL, power loss) are removed first, so a killed run's leftovers go with the next run."""
    out = check_output_path(out, inputs=inputs, overwrite=overwrite)
    label = label or out.name + "-"
    remove_dead_staging(out.parent, label)
    staging = make_staging_dir(out.parent, f"{label}pid{os.getpid()}-")
    try:
        yield staging
        move_into_place(staging, out, replace=overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_staging(parent: Path, label: str) -> int:
    """Remove ``parent/.neuronpack-staging-<label>pid<N>-*`` directories whose process N is gone; return how many."""
    prefix = STAGING_PREFIX + label
    removed = 0
    if not parent.is_dir():
        return 0
    for path in parent.iterdir():
        match = _STAGING_PID_RE.match(path.name[len(prefix):]) if path.name.startswith(prefix) else None
        if match and not pid_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a full disk or quota: ENOSPC / EDQUOT, also when a
    library wrapped it in its own exception type (torch's stream writer says "No space left on device")."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(current) or "Disk quota exceeded" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def write_text_atomic(path: Path, text: str) -> None:
    """Write a file via a temporary sibling and rename, so readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dir_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
