"""Push a local artifact to a remote store: files first, the manifest last as the commit marker.

Pushing a key whose manifest is already there is a no-op (one request). Concurrent pushes of one key are serialized
by a lease object ``<key>/.push-lease`` created with a conditional write (S3 ``If-None-Match: *``, a hard link on a
filesystem): the holder uploads and commits, the others wait and return once the manifest appears. The holder
renews the lease while it uploads; a lease nobody renewed for LEASE_STALE seconds (its pusher died) is taken over
with a conditional overwrite (``If-Match``), so a killed push never blocks the key. The manifest itself is also
written conditionally, so it can never be replaced once committed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuronpack.artifacts.manifest import MANIFEST_NAME, FileEntry, Manifest, read_manifest
from neuronpack.artifacts.remote.graph_index import index_path
from neuronpack.artifacts.remote.pull import remote_manifest_path
from neuronpack.artifacts.remote.transport import Transport, run_parallel
from neuronpack.artifacts.verify import check_files, check_key
from neuronpack.digest import sha256_stream
from neuronpack.errors import ArtifactError, RemoteError
from neuronpack.progress import NullReporter, Reporter

FILE_WORKERS = 4
LEASE_NAME = ".push-lease"
LEASE_RENEW = 20.0  # seconds between renewals by the pusher holding the lease
LEASE_STALE = 120.0  # a lease not renewed for this long belongs to a dead pusher
POLL = 1.0


@dataclass
class PushResult:
    key: str
    url: str
    pushed: bool  # False: the key was already in the store (or another push committed it)
    reason: str
    files: int
    size: int
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "remote": self.url, "url": f"{self.url}/{self.key}", "pushed": self.pushed,
                "reason": self.reason, "files": self.files, "size": self.size, "seconds": round(self.seconds, 3)}


def push_artifact(artifact_dir: Path, transport: Transport, *, reporter: Reporter | None = None,
                  workers: int = FILE_WORKERS) -> PushResult:
    """Publish ``artifact_dir`` as ``<store>/<key>/``. Each file is checked against its recorded sha256 as it is
    read, so a corrupted local artifact is refused before its manifest is committed."""
    reporter = reporter or NullReporter()
    t0 = time.perf_counter()
    manifest = read_manifest(artifact_dir)
    check_key(artifact_dir, manifest)
    check_files(artifact_dir, manifest, check_hashes=False)
    key = manifest.key

    def result(pushed: bool, reason: str) -> PushResult:
        return PushResult(key, transport.url, pushed, reason, len(manifest.files), manifest.total_size,
                          time.perf_counter() - t0)

    if transport.stat(remote_manifest_path(key)) is not None:
        _index_graphs(transport, manifest)
        return result(False, "already in the store")
    with _lease(transport, key, reporter) as lease:
        if lease is None:
            return result(False, "pushed by a concurrent push")
        _upload_files(Path(artifact_dir), transport, key, manifest, reporter, workers)
        lease.check()
        data = (Path(artifact_dir) / MANIFEST_NAME).read_bytes()
        if transport.write(remote_manifest_path(key), data, if_absent=True) is None:
            return result(False, "pushed by a concurrent push")
    _index_graphs(transport, manifest)
    return result(True, "uploaded")


def _index_graphs(transport: Transport, manifest: Manifest) -> None:
    """The key under its graph key in the store's graph index (donors.py), after the commit: a build elsewhere with
    the same graph key finds it there and downloads only its graph files."""
    if manifest.graphs and isinstance(manifest.graphs.get("key"), str):
        transport.write(index_path(manifest.graphs["key"], manifest.key), manifest.key.encode())


def _upload_files(root: Path, transport: Transport, key: str, manifest: Manifest, reporter: Reporter,
                  workers: int) -> None:
    entries = sorted(manifest.files, key=lambda e: -e.size)
    with reporter.task(f"push {key[:12]}", total=manifest.total_size, unit="bytes") as task:
        run_parallel([lambda e=e: _upload_one(root, transport, key, e, task.advance) for e in entries], workers)


def _upload_one(root: Path, transport: Transport, key: str, entry: FileEntry, on_bytes) -> None:
    path = root / entry.path
    if sha256_stream(path) != entry.sha256:
        raise ArtifactError(f"file {entry.path} does not match its sha256 (corrupted or modified): not pushed",
                            where=str(root), fix="rebuild it with `neuronpack compile --force`")
    transport.upload(f"{key}/{entry.path}", str(path), sha256=entry.sha256, on_bytes=on_bytes)


class _Lease:
    """The held push lease; a thread renews it. ``check`` raises when another pusher took it over."""

    def __init__(self, transport: Transport, path: str, etag: str) -> None:
        self.transport, self.path, self.etag = transport, path, etag
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="push-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_RENEW):
            etag = self.transport.write(self.path, _lease_body(), if_match=self.etag)
            if etag is None:
                self.lost = True
                return
            self.etag = etag

    def check(self) -> None:
        if self.lost:
            raise RemoteError("another push took over this key while uploading (this push stalled too long)",
                              where=f"{self.transport.url}/{self.path}", fix="push again")

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        if not self.lost:
            try:
                self.transport.delete([self.path])
            except RemoteError:
                pass  # the store is unreachable: the lease goes stale and the next push takes it over


@contextmanager
def _lease(transport: Transport, key: str, reporter: Reporter) -> Iterator[_Lease | None]:
    """Hold the key's push lease (None when another push committed the key while we waited)."""
    path = f"{key}/{LEASE_NAME}"
    told = False
    while True:
        etag = transport.write(path, _lease_body(), if_absent=True)
        if etag is None:
            if transport.stat(remote_manifest_path(key)) is not None:
                yield None
                return
            etag = take_over_stale_lease(transport, path)
            if etag is not None:
                reporter.warn(f"took over the push lease of {key[:16]} (its pusher stopped renewing it)")
        if etag is not None:
            break
        if not told:
            reporter.info("another push of this key is running; waiting for it to commit")
            told = True
        time.sleep(POLL)
    if transport.stat(remote_manifest_path(key)) is not None:  # committed just before we got the lease
        transport.delete([path])
        yield None
        return
    lease = _Lease(transport, path, etag)
    try:
        yield lease
    finally:
        lease.release()


def take_over_stale_lease(transport: Transport, path: str) -> str | None:
    """The lease at ``path`` taken over when nobody renewed it for LEASE_STALE seconds: its new etag, or None (it is
    fresh, gone, or another pusher took it over first: a conditional write, so of pushers racing for one stale lease
    exactly one wins)."""
    current = transport.stat(path)
    if current is None or transport.now() - current.modified <= LEASE_STALE:
        return None
    return transport.write(path, _lease_body(), if_match=current.etag)


def _lease_body() -> bytes:
    return json.dumps({"host": os.uname().nodename, "pid": os.getpid(), "at": time.time()}).encode()
