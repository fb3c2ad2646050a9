"""``file:///path``: a remote store on a shared filesystem (NFS, EFS, a mounted volume).

Every object is written to a temporary sibling and renamed, so readers never see a partial file; a conditional
create is a hard link of the finished temporary file (atomic, and refused when the name exists, also over NFS).
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
            else:
                # Compare-then-rename: not atomic on a filesystem (a lease takeover race of a few microseconds).
                current = self.stat(path)
                if if_match is not None and (current is None or current.etag != if_match):
                    return None
                os.replace(tmp, target)
            info = self.stat(path)
            return info.etag if info else None
        except OSError as exc:
            raise self._error(path, exc) from None
        finally:
            tmp.unlink(missing_ok=True)

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


def _copy(src: Path, dst: Path, on_bytes: ByteCallback) -> None:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(CHUNK_SIZE):
            fout.write(chunk)
            on_bytes(len(chunk))
        fout.flush()
        os.fsync(fout.fileno())
