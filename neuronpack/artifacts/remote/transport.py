"""The small interface every remote store speaks, and the URL that picks one.

A remote store holds ``<prefix>/<key>/<files>`` with ``<prefix>/<key>/neuronpack.json`` written last: the manifest
is the commit marker, so a key without it is invisible to readers. Two transports implement the interface:
``s3://bucket/prefix`` (any S3-compatible service, through boto3) and ``file:///path`` (a shared filesystem such as
NFS or EFS). Every path handed to a transport is relative to the store's prefix and uses ``/``.

Example (``open_transport`` is in the package, ``neuronpack.artifacts.remote``)::

    transport = open_transport("s3://models/neuronpack", endpoint_url="http://127.0.0.1:9000")
    transport.read(f"{key}/neuronpack.json")   # bytes, or None when absent
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

from neuronpack.errors import ArtifactError, RemoteError

REMOTE_ENV = "NEURONPACK_REMOTE"
SCHEMES = ("s3://", "file://")
_KEY_RE = re.compile(r"^[0-9a-f]{64}$")

ByteCallback = Callable[[int], None]


@dataclass(frozen=True)
class ObjectInfo:
    path: str  # relative to the store's prefix
    size: int
    modified: float  # seconds since the epoch, by the store's clock
    etag: str


class Transport(Protocol):
    url: str  # for messages: scheme, bucket and prefix only (never credentials)

    def read(self, path: str) -> bytes | None:
        """The whole object, or None when it does not exist."""

    def stat(self, path: str) -> ObjectInfo | None: ...

    def now(self) -> float:
        """The store's clock (a lease's age is measured against it, not against this machine's clock)."""

    def write(self, path: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str | None:
        """Write a small object; its new etag. With ``if_absent`` / ``if_match`` (an etag) the write is conditional
        and atomic, and None means the condition failed."""

    def upload(self, path: str, local: str, *, sha256: str, on_bytes: ByteCallback) -> None:
        """Upload a file (multipart and in parallel when large), recording its sha256 with the object."""

    def download(self, path: str, local: str, *, on_bytes: ByteCallback) -> None:
        """Download an object to ``local`` (ranges in parallel when large)."""

    def list_dirs(self) -> list[str]:
        """The first-level names under the prefix (the keys, committed or not)."""

    def list_files(self, directory: str) -> list[ObjectInfo]:
        """Every object below ``directory``, recursively."""

    def delete(self, paths: list[str]) -> None: ...


def is_remote_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEMES)


def split_artifact_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix/<key>`` -> (``s3://bucket/prefix``, key)."""
    base, _, key = url.rstrip("/").rpartition("/")
    if not _KEY_RE.match(key) or base.endswith(":/"):
        raise RemoteError("a remote artifact URL must end with the artifact's 64-character key", where=url,
                          fix="use <store URL>/<key>, e.g. s3://bucket/prefix/<key> (the key from "
                          "`neuronpack compile --dry-run --format json`)")
    return base, key


def is_key(name: str) -> bool:
    return bool(_KEY_RE.match(name))


def run_parallel(jobs: list[Callable[[], None]], workers: int) -> None:
    """Run file transfers on ``workers`` threads; on the first failure cancel what has not started, wait for the
    rest, and raise (an ArtifactError, e.g. a refused file, before a transport error)."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(job) for job in jobs]
        _, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        wait(pending)
    errors = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
    if errors:
        raise next((e for e in errors if isinstance(e, ArtifactError)), errors[0])
