"""Pull an artifact by key from a remote store into the local content-addressed root, atomically.

The remote manifest is read first (one request: that is also the whole cost of a remote cache lookup) and checked
like a local one: schema, key equal to the hash of its recorded inputs, safe file paths. Files download in parallel
into a staging directory of the local store, each checked against the manifest's size and sha256 as it lands; the
manifest is written last and the directory is renamed into place (the store's staging/publish path, under the same
per-key lock as a build). A file that does not match is refused by name and nothing is installed. A pull cut off by
the network keeps its staging directory: the next pull of that key keeps every file already verified and fetches the
rest.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuronpack.artifacts.key import compute_key
from neuronpack.artifacts.manifest import MANIFEST_NAME, FileEntry, Manifest, parse_manifest, write_manifest
from neuronpack.artifacts.paths import member_path
from neuronpack.artifacts.remote.transport import Transport, run_parallel
from neuronpack.artifacts.store import hidden_dir, key_lock, new_staging, publish
from neuronpack.artifacts.verify import check_files, quick_check
from neuronpack.digest import sha256_stream
from neuronpack.errors import ArtifactError, RemoteError
from neuronpack.fsutil import STAGING_PREFIX
from neuronpack.progress import NullReporter, Reporter

FILE_WORKERS = 4  # files in flight at once (each large file also moves in parallel parts, see s3.py)
PULL_TAG = "pull"


@dataclass
class PullResult:
    path: Path
    key: str
    url: str
    installed: bool  # False: the artifact was already in the local root
    files: int
    size: int
    downloaded_bytes: int = 0
    reused_files: int = 0  # verified files kept from an interrupted pull
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "key": self.key, "remote": self.url, "installed": self.installed,
                "files": self.files, "size": self.size, "downloaded_bytes": self.downloaded_bytes,
                "reused_files": self.reused_files, "seconds": round(self.seconds, 3)}


def remote_manifest_path(key: str) -> str:
    return f"{key}/{MANIFEST_NAME}"


def read_remote_manifest(data: bytes, *, where: str) -> Manifest:
    """A manifest from a remote object's bytes (schema and types checked by parse_manifest)."""
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise ArtifactError(f"{MANIFEST_NAME} is not valid JSON ({exc})", where=where,
                            fix="remove the key with `neuronpack gc --remote` and push it again") from None
    return parse_manifest(obj, where=where)


def fetch_manifest(transport: Transport, key: str) -> Manifest | None:
    """The remote manifest of ``key`` (checked: key, inputs, file list), or None when the key is not committed."""
    data = transport.read(remote_manifest_path(key))
    if data is None:
        return None
    where = f"{transport.url}/{remote_manifest_path(key)}"
    manifest = read_remote_manifest(data, where=where)
    if manifest.key != key:
        raise ArtifactError(f"the manifest stored under {key[:16]} is for key {manifest.key[:16]}",
                            where=where, fix="remove the key with `neuronpack gc --remote` and push it again")
    if compute_key(manifest.key_inputs) != key:
        raise ArtifactError("the remote manifest's key does not match its recorded inputs (the manifest was edited)",
                            where=where, fix="remove the key with `neuronpack gc --remote` and push it again")
    return manifest


def pull_artifact(transport: Transport, key: str, final: Path, *, manifest: Manifest | None = None,
                  reporter: Reporter | None = None, workers: int = FILE_WORKERS) -> PullResult:
    """Install the remote artifact ``key`` as ``final`` (``<store>/<key>``, or any path whose parent is a store),
    or return at once when it is already there. Raises RemoteError when the key is not in the store."""
    reporter = reporter or NullReporter()
    t0 = time.perf_counter()
    final = Path(final).absolute()
    if (local := quick_check(final, key)) is not None:
        return _present(final, key, transport, local, t0)
    manifest = manifest or fetch_manifest(transport, key)
    if manifest is None:
        raise RemoteError(f"key {key[:16]}... is not in the remote store (or its push has not finished)",
                          where=transport.url, fix="check the key and the store URL, or push it first")
    with key_lock(final.parent / ".locks", final.name,
                  on_wait=lambda: reporter.info("another pull or build of this key is running; waiting for it")):
        if (local := quick_check(final, key)) is not None:
            return _present(final, key, transport, local, t0)
        staging = _staging_for(final.parent, key)
        try:
            downloaded, reused = _fill(transport, key, manifest, staging, reporter, workers)
            write_manifest(staging, manifest)  # last: only now is the directory an artifact
            check_files(staging, manifest, check_hashes=False)
            publish(staging, final, replace=final.exists(), framework=manifest.framework)
        except ArtifactError:
            shutil.rmtree(staging, ignore_errors=True)  # refused content is never kept for a resume
            raise
    return PullResult(final, key, transport.url, True, len(manifest.files), manifest.total_size, downloaded, reused,
                      time.perf_counter() - t0)


def _present(final: Path, key: str, transport: Transport, manifest: Manifest, t0: float) -> PullResult:
    return PullResult(final, key, transport.url, False, len(manifest.files), manifest.total_size,
                      seconds=time.perf_counter() - t0)


def _staging_for(store: Path, key: str) -> Path:
    """A staging directory for this pull: an interrupted pull's one when there is one (we hold the key's lock, so
    its owner is gone), renamed to carry this process id so `neuronpack gc` sees it as live."""
    created = new_staging(store, key)
    fresh = created.with_name(f"{created.name}-{PULL_TAG}")
    os.rename(created, fresh)
    leftovers = sorted((p for p in hidden_dir(store, "staging").glob(f"{STAGING_PREFIX}{key[:16]}-*-{PULL_TAG}")
                        if p != fresh and p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not leftovers:
        return fresh
    for old in leftovers[:-1]:
        shutil.rmtree(old, ignore_errors=True)
    fresh.rmdir()
    os.rename(leftovers[-1], fresh)
    return fresh


def _fill(transport: Transport, key: str, manifest: Manifest, staging: Path, reporter: Reporter,
          workers: int) -> tuple[int, int]:
    """Make staging hold exactly the manifest's files (verified); returns (bytes downloaded, files reused)."""
    entries = {e.path: e for e in manifest.files}
    for rel in entries:  # before anything is written: every name stays inside the artifact (paths.py)
        member_path(staging, rel)
    for path in sorted(staging.rglob("*"), reverse=True):
        rel = path.relative_to(staging).as_posix()
        if path.is_file() and rel not in entries or path.is_symlink():
            path.unlink()
    reused = {e.path for e in entries.values() if _already_there(staging / e.path, e)}
    todo = sorted((e for e in entries.values() if e.path not in reused), key=lambda e: -e.size)
    with reporter.task(f"pull {key[:12]}", total=manifest.total_size, unit="bytes") as task:
        task.advance(sum(entries[p].size for p in reused))
        run_parallel([lambda e=e: _download_one(transport, key, e, staging, task.advance) for e in todo], workers)
    return sum(e.size for e in todo), len(reused)


def _already_there(path: Path, entry: FileEntry) -> bool:
    return path.is_file() and path.stat().st_size == entry.size and sha256_stream(path) == entry.sha256


def _download_one(transport: Transport, key: str, entry: FileEntry, staging: Path, on_bytes) -> None:
    rel = entry.path
    dest = member_path(staging, rel)
    dest.parent.mkdir(parents=True, exist_ok=True)
    transport.download(f"{key}/{rel}", str(dest), on_bytes=on_bytes)
    size = dest.stat().st_size
    if size != entry.size or sha256_stream(dest) != entry.sha256:
        dest.unlink(missing_ok=True)
        detail = f"{size} bytes, the manifest says {entry.size}" if size != entry.size else "sha256 differs"
        raise ArtifactError(
            f"remote file {rel} does not match the manifest ({detail}): refused, nothing installed",
            where=f"{transport.url}/{key}/{rel}",
            fix="the stored copy is corrupted or was modified: remove the key with `neuronpack gc --remote` and "
                "push it again from a trusted build",
        )
