"""``file:///path``: a remote store on a shared filesystem (NFS, EFS, a mounted volume).

Every object is written to a temporary sibling and renamed, so readers never see a partial file; a conditional
create is a hard link of the finished temporary file (atomic, and refused when the name exists, also over NFS).

A write ``if_match`` an etag (the push lease's renewal and takeover) is a compare-and-swap built from the same atomic
step: the writer first creates a claim named after the etag it expects, ``.np-tmp-cas-<name>-<etag>``, by a hard
link, so of all the writers expecting one version exactly one gets past it; that one checks the object still has the
etag and renames its new version into place, then removes the claim. A writer expecting an etag the object no
longer has fails the check even when it gets a claim (removed claims can be made again). A claim left by a writer
that died between its two steps is broken after ``CLAIM_STALE`` seconds, again by a hard link (one breaker per
claim), so a key is never stuck.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from neuronpack.artifacts.remote.transport import ByteCallback, ObjectInfo
from neuronpack.errors import RemoteError

CHUNK_SIZE = 8 * 1024 * 1024
CLAIM_STALE = 30.0  # seconds: a compare-and-swap takes microseconds; a claim this old belongs to a dead writer


class FileTransport:
    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise RemoteError("a file:// URL needs an absolute path", where=url, fix="use file:///absolute/path")
        self.base = Path(unquote(parsed.path)).absolute()
        self.url = f"file://{self.base}"

    def _path(self, path: str) -> Path:
        return self.base / path

    def read(self, path: str) -> bytes | None:
        try:
            return self._path(path).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._error(path, exc) from None

    def stat(self, path: str) -> ObjectInfo | None:
        try:
            st = self._path(path).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return ObjectInfo(path, st.st_size, st.st_mtime, f"{st.st_mtime_ns}-{st.st_size}-{st.st_ino}")

    def now(self) -> float:
        return time.time()

    def write(self, path: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str | None:
        target = self._path(path)
        tmp = self._temp_for(target)
        try:
            tmp.write_bytes(data)
            if if_absent:
                try:
                    os.link(tmp, target)
                except FileExistsError:
                    return None
            elif if_match is not None:
                if not self._swap(path, tmp, if_match):
                    return None
            else:
                os.replace(tmp, target)
            info = self.stat(path)
            return info.etag if info else None
        except OSError as exc:
            raise self._error(path, exc) from None
        finally:
            tmp.unlink(missing_ok=True)

    def _swap(self, path: str, new: Path, expected: str) -> bool:
        """Rename ``new`` onto ``path`` if ``path`` has etag ``expected``, as one step against every other writer."""
        target = self._path(path)
        claim = target.with_name(f".np-tmp-cas-{target.name}-{expected}")
        if not _claim(claim, new):
            return False
        try:
            current = self.stat(path)
            if current is None or current.etag != expected:
                return False
            os.replace(new, target)
            return True
        finally:
            _unclaim(claim)

    def upload(self, path: str, local: str, *, sha256: str, on_bytes: ByteCallback) -> None:
        target = self._path(path)
        tmp = self._temp_for(target)
        try:
            _copy(Path(local), tmp, on_bytes)
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self._error(path, exc) from None

    def download(self, path: str, local: str, *, on_bytes: ByteCallback) -> None:
        try:
            _copy(self._path(path), Path(local), on_bytes)
        except OSError as exc:
            raise self._error(path, exc) from None

    def list_dirs(self) -> list[str]:
        if not self.base.is_dir():
            return []
        return sorted(p.name for p in self.base.iterdir() if p.is_dir() and not p.name.startswith("."))

    def list_files(self, directory: str) -> list[ObjectInfo]:
        root = self._path(directory)
        rows = []
        for p in sorted(root.rglob("*")) if root.is_dir() else []:
            if p.is_file() and not p.name.startswith(".np-tmp-"):
                info = self.stat(p.relative_to(self.base).as_posix())
                if info is not None:
                    rows.append(info)
        return rows

    def delete(self, paths: list[str]) -> None:
        dirs = set()
        for path in paths:
            self._path(path).unlink(missing_ok=True)
            dirs.update(self._path(path).parents)
        for d in sorted((d for d in dirs if self.base in d.parents), key=lambda d: -len(d.parts)):
            if d.is_dir() and not any(d.iterdir()):
                shutil.rmtree(d, ignore_errors=True)

    def _temp_for(self, target: Path) -> Path:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._error(target.relative_to(self.base).as_posix(), exc) from None
        fd, name = tempfile.mkstemp(prefix=".np-tmp-", dir=target.parent)
        os.close(fd)
        return Path(name)

    def _error(self, path: str, exc: OSError) -> RemoteError:
        return RemoteError(f"cannot access the store ({exc.strerror or exc})", where=f"{self.url}/{path}",
                           fix="check that the path exists, is mounted and is writable")


def _claim(claim: Path, source: Path) -> bool:
    """Create ``claim`` as a hard link of ``source``: True for exactly one of the processes trying at once. A claim
    older than CLAIM_STALE (its writer died between its two steps) is taken over by one of them, by a hard link
    named after the stale claim's own identity."""
    try:
        os.link(source, claim)
        return True
    except FileExistsError:
        pass
    try:
        st = claim.stat()
    except FileNotFoundError:
        return False  # its writer just finished: the version it expected is gone, so is ours
    if time.time() - st.st_mtime <= CLAIM_STALE:
        return False
    try:
        os.link(source, claim.with_name(f"{claim.name}.stale-{st.st_mtime_ns}-{st.st_ino}"))
        return True
    except FileExistsError:
        return False


def _unclaim(claim: Path) -> None:
    for stale in claim.parent.glob(f"{claim.name}.stale-*"):
        stale.unlink(missing_ok=True)
    claim.unlink(missing_ok=True)


def _copy(src: Path, dst: Path, on_bytes: ByteCallback) -> None:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(CHUNK_SIZE):
            fout.write(chunk)
            on_bytes(len(chunk))
        fout.flush()
        os.fsync(fout.fileno())
