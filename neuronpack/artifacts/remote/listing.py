"""`neuronpack ls --remote` and `neuronpack gc --remote`: what a remote store holds, and cleaning it.

A key is listed only once its manifest (the commit marker) is there. gc keeps the newest N committed keys (by push
time) and removes the rest, manifest first so readers stop seeing a key before its files go; it also removes keys
that never committed (an interrupted push) once nothing under them changed for UNFINISHED_GRACE seconds, so a push
in progress (which renews its lease) is never touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neuronpack.artifacts.manifest import MANIFEST_NAME, Manifest
from neuronpack.artifacts.precision import weights_precision
from neuronpack.artifacts.remote.graph_index import graph_index_entries
from neuronpack.artifacts.remote.pull import read_remote_manifest
from neuronpack.artifacts.remote.push import LEASE_STALE
from neuronpack.artifacts.remote.transport import ObjectInfo, Transport, is_key

UNFINISHED_GRACE = 4 * LEASE_STALE


@dataclass
class RemoteKey:
    key: str
    objects: list[ObjectInfo]
    committed: bool  # its manifest is there
    manifest: Manifest | None = None  # read when asked for

    @property
    def pushed_at(self) -> float:
        committed = [o.modified for o in self.objects if o.path.endswith(f"/{MANIFEST_NAME}")]
        return committed[0] if committed else max((o.modified for o in self.objects), default=0.0)


def scan_remote(transport: Transport, *, read_manifests: bool = True) -> list[RemoteKey]:
    """Every key directory under the store (one listing request per key, one manifest read per committed key)."""
    keys = []
    for name in transport.list_dirs():
        if not is_key(name):
            continue
        objects = transport.list_files(name)
        committed = any(o.path == f"{name}/{MANIFEST_NAME}" for o in objects)
        manifest = None
        if committed and read_manifests:
            data = transport.read(f"{name}/{MANIFEST_NAME}")
            where = f"{transport.url}/{name}/{MANIFEST_NAME}"
            manifest = read_remote_manifest(data, where=where) if data else None
        keys.append(RemoteKey(name, objects, committed, manifest))
    return keys


def list_remote(transport: Transport) -> list[dict[str, Any]]:
    """Committed artifacts in the store, newest push first (the same rows as `neuronpack ls`)."""
    now = transport.now()
    rows = []
    for item in scan_remote(transport):
        m = item.manifest
        if m is None:
            continue
        rows.append({
            "key": item.key,
            "url": f"{transport.url}/{item.key}",
            "model": m.model.source,
            "framework": m.framework,
            "weights_precision": weights_precision(m).to_dict(),
            "buckets": m.buckets.to_dict(),
            "size": m.total_size,
            "created_at": m.created_at,
            "age_seconds": round(max(0.0, now - item.pushed_at), 1),
        })
    return sorted(rows, key=lambda r: r["age_seconds"])


@dataclass
class RemoteGcItem:
    key: str
    kind: str  # artifact | unfinished
    size: int
    reason: str
    paths: list[str]


def plan_remote_gc(transport: Transport, *, keep: int | None = None,
                   older_than: float | None = None) -> list[RemoteGcItem]:
    now = transport.now()
    scanned = scan_remote(transport, read_manifests=False)
    indexed = graph_index_entries(transport)  # an artifact removed takes its graph-index entry with it
    committed = sorted((k for k in scanned if k.committed), key=lambda k: -k.pushed_at)
    items = []
    for index, item in enumerate(committed):
        reasons = []
        if keep is not None and index >= keep:
            reasons.append(f"beyond the newest {keep}")
        if older_than is not None and now - item.pushed_at > older_than:
            reasons.append(f"older than {older_than:.0f}s")
        if reasons:
            items.append(_item(item, "artifact", " and ".join(reasons), indexed.get(item.key, [])))
    for item in scanned:
        if not item.committed and now - item.pushed_at > UNFINISHED_GRACE:
            items.append(_item(item, "unfinished", "no manifest (an interrupted push)", indexed.get(item.key, [])))
    return items


def _item(item: RemoteKey, kind: str, reason: str, index: list[str]) -> RemoteGcItem:
    manifest = [o.path for o in item.objects if o.path.endswith(f"/{MANIFEST_NAME}")]
    rest = [o for o in item.objects if o.path not in manifest]
    # an artifact's size is its files' (as ls and a local gc count it, the manifest aside); unfinished: every object
    size = sum(o.size for o in (rest if kind == "artifact" else item.objects))
    return RemoteGcItem(item.key, kind, size, reason, manifest + [o.path for o in rest] + index)


def run_remote_gc(transport: Transport, items: list[RemoteGcItem]) -> None:
    """Delete each key's manifest first (readers stop seeing it at once), then its files."""
    for item in items:
        commit, rest = item.paths[:1], item.paths[1:]
        if item.kind == "artifact":
            transport.delete(commit)
            transport.delete(rest)
        else:
            transport.delete(item.paths)
