"""A remote store's graph index: ``.graphs/<graph key>/<artifact key>``, one small object per pushed artifact that
records a graph key, written by push after the manifest commits. A build elsewhere with the same graph key finds a
donor there (artifacts/donors.py) and downloads only its graph files; an entry whose artifact is gone is skipped.

Example::

    donor = find_remote_donor(transport, graph_key, backend.graph_files, exclude=key)
"""

from __future__ import annotations

from neuronpack.artifacts.donors import Donor, GraphFiles, donor_from_manifest, graph_section
from neuronpack.artifacts.remote.pull import fetch_manifest
from neuronpack.artifacts.remote.transport import Transport, is_key
from neuronpack.errors import ArtifactError

GRAPH_INDEX = ".graphs"


def index_path(graph_key: str, key: str) -> str:
    return f"{GRAPH_INDEX}/{graph_key}/{key}"


def find_remote_donor(transport: Transport, graph_key: str, graph_files: GraphFiles, *,
                      exclude: str) -> Donor | None:
    """A committed artifact of ``graph_key`` in the remote store, through its graph index (one listing, then one
    manifest read per candidate until one qualifies)."""
    candidates = sorted({info.path.rsplit("/", 1)[-1] for info in transport.list_files(f"{GRAPH_INDEX}/{graph_key}")})
    for key in candidates:
        if not is_key(key) or key == exclude:
            continue
        try:
            manifest = fetch_manifest(transport, key)  # checked: its key is the hash of its recorded inputs
        except ArtifactError:  # an edited manifest is no donor (pull and ls report it)
            continue
        if manifest is None:  # gone from the store since it was indexed
            continue
        data = manifest.to_json()
        if (graph_section(data) or {}).get("key") != graph_key:
            continue
        donor = donor_from_manifest(data, graph_files, source=transport.url, transport=transport)
        if donor is not None:
            return donor
    return None


def graph_index_entries(transport: Transport) -> dict[str, list[str]]:
    """artifact key -> its graph-index objects (one listing of the index)."""
    entries: dict[str, list[str]] = {}
    for info in transport.list_files(GRAPH_INDEX):
        entries.setdefault(info.path.rsplit("/", 1)[-1], []).append(info.path)
    return entries
