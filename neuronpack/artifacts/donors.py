"""Donors: published artifacts whose compiled graphs a build of the same graph key takes instead of compiling.

A build whose artifact key misses looks for a complete artifact with the same graph key (graph_key.py) in the local
store, then (with ``--remote``) in the remote one, and installs only the donor's graph files into its staging
directory: hard links within one filesystem (an artifact is never modified after publish), copies otherwise, each
file checked against the donor's manifest first; from a remote store, only those files are downloaded (each checked as
it lands), never the donor's weights. The new artifact records the donor (``graphs.from``) but stands alone: its own
manifest lists every file with its sha256, so verify, push, pull and gc of either artifact never touch the other.

A remote store finds donors through its graph index (remote/graph_index.py).

Example::

    donor = find_local_donor([store], graph_key, backend.graph_files, exclude=key)
    if donor: install_donor_files(donor, staging, reporter)
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuronpack.artifacts.manifest_json import complete_manifest_json
from neuronpack.artifacts.paths import member_path
from neuronpack.digest import sha256_stream
from neuronpack.errors import ArtifactError
from neuronpack.progress import Reporter

GraphFiles = Callable[[Sequence[str]], list[str]]


@dataclass(frozen=True)
class Donor:
    key: str
    graph_key: str
    files: tuple[dict[str, Any], ...]  # the donor manifest's entries (path, size, sha256) of its graph files
    seconds: float  # the compile time these graphs cost where they were first built
    source: str  # the donor's local directory, or the remote store's URL
    path: Path | None = None  # local donors
    transport: Any = None  # remote donors: the store's Transport (artifacts/remote)

    def record(self) -> dict[str, Any]:
        """What the new artifact's manifest keeps of its donor (``graphs.from``)."""
        return {"key": self.key, "source": self.source, "files": len(self.files),
                "bytes": sum(int(f["size"]) for f in self.files)}


def graph_section(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """A manifest's ``graphs`` section (None for artifacts built before graph keys)."""
    graphs = manifest.get("graphs")
    return graphs if isinstance(graphs, dict) and isinstance(graphs.get("key"), str) else None


def donor_from_manifest(manifest: dict[str, Any], graph_files: GraphFiles, *, source: str, path: Path | None = None,
                        transport: Any = None) -> Donor | None:
    """The donor a complete manifest offers (None when it has no graph key or no graph file)."""
    graphs = graph_section(manifest)
    entries = {e["path"]: e for e in manifest.get("files") or [] if isinstance(e, dict) and "path" in e}
    wanted = graph_files(sorted(entries)) if graphs else []
    if not wanted:
        return None
    return Donor(key=manifest["key"], graph_key=graphs["key"], files=tuple(entries[p] for p in wanted),
                 seconds=float(graphs.get("seconds") or 0.0), source=source, path=path, transport=transport)


def find_local_donor(stores: Iterable[Path], graph_key: str, graph_files: GraphFiles, *,
                     exclude: str) -> Donor | None:
    """The newest complete artifact of ``graph_key`` in the given store directories (``.../neuron-compiled-artifacts``),
    other than the key ``exclude`` (the one being built)."""
    found: list[tuple[str, Donor]] = []
    for store in dict.fromkeys(Path(s) for s in stores):
        if not store.is_dir():
            continue
        for path in store.iterdir():
            if path.name.startswith(".") or path.name == exclude or not path.is_dir():
                continue
            manifest = complete_manifest_json(path)
            graphs = manifest and graph_section(manifest)
            if not graphs or graphs["key"] != graph_key or manifest["key"] != path.name:
                continue
            donor = donor_from_manifest(manifest, graph_files, source=str(path), path=path)
            if donor is not None:
                found.append((str(manifest.get("created_at") or ""), donor))
    return max(found, key=lambda item: item[0])[1] if found else None


def install_donor_files(donor: Donor, staging: Path, reporter: Reporter) -> None:
    """Put the donor's graph files into ``staging`` at their relative paths, each checked against the donor's
    manifest (size and sha256): linked or copied from a local donor, downloaded from a remote one. ArtifactError
    when a file does not match (the donor was altered): the caller builds without it."""
    total = sum(int(f["size"]) for f in donor.files)
    with reporter.task(f"graphs of {donor.key[:12]}", total=total, unit="bytes") as task:
        for entry in donor.files:
            dest = member_path(staging, entry["path"])
            dest.parent.mkdir(parents=True, exist_ok=True)
            if donor.path is not None:
                source = member_path(donor.path, entry["path"])
                _check(source, entry, where=str(source))
                _link_or_copy(source, dest)
            else:
                donor.transport.download(f"{donor.key}/{entry['path']}", str(dest), on_bytes=lambda n: None)
                _check(dest, entry, where=f"{donor.source}/{donor.key}/{entry['path']}")
            task.advance(int(entry["size"]))


def _check(path: Path, entry: dict[str, Any], *, where: str) -> None:
    if not path.is_file() or path.stat().st_size != entry["size"] or sha256_stream(path) != entry["sha256"]:
        raise ArtifactError(f"the donor's graph file {entry['path']} does not match its manifest", where=where,
                            fix="run `neuronpack verify` on the donor (and `gc` it), or compile with --no-reuse")


def _link_or_copy(source: Path, dest: Path) -> None:
    """A hard link (same filesystem: no bytes copied, the file stays when either artifact is removed), else a copy."""
    try:
        os.link(source, dest)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
            raise
        shutil.copy2(source, dest)
