"""`neuronpack ls` and `neuronpack gc`: what a root holds, and cleaning it.

gc removes (oldest first) artifacts beyond --keep N or older than --older-than, staging leftovers of builds whose
process is gone, directories that never became valid artifacts, and failed-build logs, then prunes digest-cache
entries of files that are gone. It never touches a staging directory of a live build (or of a live gc). It also
removes the pods' writable directories (``$TMPDIR/neuronpack-vllm/<key>``, pod_caches.py) of artifacts that are gone
or that it removes, unless a pod still runs there.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuronpack.artifacts.manifest import MANIFEST_NAME
from neuronpack.artifacts.pod_caches import remove_pod_cache, unused_pod_caches
from neuronpack.artifacts.precision import weights_precision
from neuronpack.artifacts.verify import quick_check
from neuronpack.digest import prune_digest_cache
from neuronpack.errors import NeuronpackError
from neuronpack.fsutil import dir_size, make_staging_dir, pid_alive, remove_tree

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
# Staging names carry the builder's pid: "<key[:16]>-<pid>-..." for builds, "gc-<pid>-..." for gc's trash.
_PID_RE = re.compile(r"^(?:[0-9a-f]{16}|gc)-(\d+)-")
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """'90s', '30m', '12h', '7d', '2w' -> seconds."""
    match = _DURATION_RE.match(text.strip())
    if not match:
        raise NeuronpackError(f"cannot read duration {text!r}", where="--older-than",
                              fix="use a number and a unit: 30m, 12h, 7d, 2w")
    return float(match.group(1)) * _UNITS[match.group(2)]


def list_artifacts(store: Path) -> list[dict[str, Any]]:
    """Valid artifacts under a store, newest first."""
    if not store.is_dir():
        return []
    now = time.time()
    rows = []
    for path in store.iterdir():
        if path.name.startswith(".") or not path.is_dir():
            continue
        manifest = quick_check(path)
        if manifest is None:
            continue
        mtime = (path / MANIFEST_NAME).stat().st_mtime
        rows.append({
            "key": manifest.key,
            "path": str(path),
            "model": manifest.model.source,
            "framework": manifest.framework,
            "weights_precision": weights_precision(manifest).to_dict(),
            "buckets": manifest.buckets.to_dict(),
            "size": manifest.total_size,
            "created_at": manifest.created_at,
            "age_seconds": round(now - mtime, 1),
        })
    return sorted(rows, key=lambda r: r["age_seconds"])


@dataclass
class GcItem:
    path: Path
    kind: str  # artifact | staging | invalid | failed-log | pod-cache
    size: int
    reason: str


def plan_gc(store: Path, *, keep: int | None = None, older_than: float | None = None) -> list[GcItem]:
    items = _plan_store(store, keep=keep, older_than=older_than)
    removed = {item.path.absolute() for item in items if item.kind in ("artifact", "invalid")}

    def gone(artifact: Path) -> bool:
        return artifact.absolute() in removed or quick_check(artifact) is None

    items += [GcItem(base, "pod-cache", dir_size(base), reason) for base, reason in unused_pod_caches(gone)]
    return items


def _plan_store(store: Path, *, keep: int | None, older_than: float | None) -> list[GcItem]:
    items: list[GcItem] = []
    if not store.is_dir():
        return items
    artifacts = list_artifacts(store)
    for index, row in enumerate(artifacts):
        reasons = []
        if keep is not None and index >= keep:
            reasons.append(f"beyond the newest {keep}")
        if older_than is not None and row["age_seconds"] > older_than:
            reasons.append(f"older than {older_than:.0f}s")
        if reasons:
            items.append(GcItem(Path(row["path"]), "artifact", row["size"], " and ".join(reasons)))
    valid = {row["path"] for row in artifacts}
    for path in store.iterdir():
        if path.is_dir() and _KEY_RE.match(path.name) and str(path) not in valid:
            items.append(GcItem(path, "invalid", dir_size(path), "no valid manifest"))
    staging = store / ".staging"
    if staging.is_dir():
        for path in staging.iterdir():
            match = _PID_RE.search(path.name.removeprefix(".neuronpack-staging-"))
            if match and pid_alive(int(match.group(1))):
                continue
            items.append(GcItem(path, "staging", dir_size(path) if path.is_dir() else 0, "leftover of a dead build"))
    failed = store / ".failed"
    if failed.is_dir():
        for path in failed.iterdir():
            items.append(GcItem(path, "failed-log", path.stat().st_size, "failed-build log"))
    return items


def run_gc(items: list[GcItem]) -> int:
    """Remove ``items``, then prune the digest cache of files that are gone; return how many cache entries went.

    An artifact (or invalid) directory is first renamed into ``.staging/gc-<pid>-*`` and only then deleted, so it
    disappears in one step: a gc killed at any moment never leaves a half-deleted artifact where a server could find
    it, and the next gc removes the trash of a dead one."""
    trash: Path | None = None
    for item in items:
        path = item.path
        if item.kind == "pod-cache":
            remove_pod_cache(path)  # unless a pod started there since the plan
            continue
        if item.kind in ("artifact", "invalid") and path.is_dir():
            if trash is None:
                trash = make_staging_dir(path.parent / ".staging", f"gc-{os.getpid()}-")
            try:
                os.rename(path, trash / path.name)
                path = trash / path.name
            except OSError:
                pass  # already gone, or not renameable: delete in place
        if path.is_dir():
            remove_tree(path)
        else:
            path.unlink(missing_ok=True)
    if trash is not None:
        remove_tree(trash)
    return prune_digest_cache()
