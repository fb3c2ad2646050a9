"""The plugin's compile cache on disk: which entries are complete (upstream's rule), and packaging them into an
artifact with only what a lookup reads.

Facts from vllm_neuron/compile/cache.py (0.21; the tests run that file on what this module writes):

- one entry per compiled graph, ``<root>/<32 hex>/``; it is complete (``_is_cache_complete``) when it holds
  ``graph.hlo``, ``graph_<entry name>.neff`` (``get_neff_filename``), ``.compilation_complete`` (written last by
  ``_store_local``) and at least one ``.artifact_metadata_v<N>.json``; ``_build_cache_artifact`` also requires the
  metadata's ``cache_key`` to equal the directory name;
- the root also holds lock files (``.<key>.compilation_metadata`` and ``.lock``, with PIDs and command lines),
  entries hold ``.cache_accessed`` (rewritten on every hit) and debug files (``fxgraph.txt``, ``command.txt`` and
  ``log-neuron-cc.txt`` with absolute paths, ``hlo_passes/``, per-rank work directories): none is read by a lookup,
  so none is packaged;
- NKI kernel results live in ``<root>/nki/<key>.json`` (vllm_neuron/nki/nki_cache.py), fetched from the remote root's
  ``nki/`` the same way: packaged, without their ``.lock`` and ``.tmp.*`` files.

Example::

    packed = package_entries(work_root, staging / CACHE_DIR)
    packed.entries, packed.nki, packed.dropped     # 12, 0, 41
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from neuronpack.errors import ArtifactError, BuildError

CACHE_DIR = "compile_cache"  # inside the artifact: the root handed to the plugin's remote-cache lookup
NKI_DIR = "nki"
HLO = "graph.hlo"
COMPLETE = ".compilation_complete"
_ENTRY_NAME = re.compile(r"[0-9a-f]{32}")
_METADATA = re.compile(r"\.artifact_metadata_v\d+\.json")


@dataclass(frozen=True)
class PackedCache:
    entries: int  # complete graph entries packaged
    nki: int  # NKI kernel results packaged
    bytes: int
    dropped: int  # files left behind (locks, access markers, debug files with absolute paths)


def neff_name(entry_name: str) -> str:
    """``graph_<entry name>.neff``, the NEFF file name upstream looks for."""
    return f"graph_{entry_name}.neff"


def entry_problem(entry: Path) -> str | None:
    """Why ``entry`` is not a complete cache entry by upstream's rule, or None when it is."""
    name = entry.name
    for required in (HLO, neff_name(name), COMPLETE):
        if not (entry / required).is_file():
            return f"it has no {required}" + (" (the compile did not finish)" if required == COMPLETE else "")
    metadata = sorted(p for p in entry.iterdir() if _METADATA.fullmatch(p.name))
    if not metadata:
        return "it has no .artifact_metadata_v<N>.json"
    try:
        key = json.loads(metadata[0].read_text()).get("cache_key")
    except (OSError, ValueError, AttributeError) as exc:
        return f"its {metadata[0].name} is unreadable ({exc})"
    if key != name:
        return f"its metadata names cache key {key!r}, not the directory's"
    return None


def entry_dirs(root: Path) -> list[Path]:
    """The graph entries under a cache root (32-hex directories; staging copies ``<key>.tmp.<pid>`` are not)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _ENTRY_NAME.fullmatch(p.name))


def package_entries(root: Path, dest: Path) -> PackedCache:
    """Copy every complete entry of the cache ``root`` (and its NKI results) into ``dest``, keeping only the files
    a lookup reads. BuildError when the root has no entry or any entry is incomplete: nothing half-built ships."""
    entries = entry_dirs(root)
    if not entries:
        raise BuildError("the plugin's CPU compile left no compile-cache entry", where=str(root),
                         fix="check the compile log: the model may not have reached graph capture")
    for entry in entries:
        problem = entry_problem(entry)
        if problem is not None:
            raise BuildError(f"compile-cache entry {entry.name} is incomplete: {problem}", where=str(entry),
                             fix="rerun the compile; an entry is packaged only once upstream marks it complete")
    total = kept = 0
    for entry in entries:
        metadata = {p.name for p in entry.iterdir() if _METADATA.fullmatch(p.name)}
        keep = {HLO, neff_name(entry.name), COMPLETE} | metadata
        (dest / entry.name).mkdir(parents=True)
        for name in sorted(keep):
            shutil.copyfile(entry / name, dest / entry.name / name)
            total += (entry / name).stat().st_size
        kept += len(keep)
    nki = sorted(p for p in (root / NKI_DIR).glob("*.json") if ".tmp." not in p.name)
    if nki:
        (dest / NKI_DIR).mkdir(parents=True)
        for path in nki:
            shutil.copyfile(path, dest / NKI_DIR / path.name)
            total += path.stat().st_size
    every = sum(len(files) for _, _, files in os.walk(root))
    return PackedCache(entries=len(entries), nki=len(nki), bytes=total, dropped=every - kept - len(nki))


def check_packaged(cache: Path) -> int:
    """The number of complete entries in an artifact's packaged cache; ArtifactError when one is not complete (a
    changed artifact: verify's file check catches edits, this catches a build that packaged one wrongly)."""
    entries = entry_dirs(cache)
    for entry in entries:
        problem = entry_problem(entry)
        if problem is not None:
            raise ArtifactError(f"packaged cache entry {entry.name} is incomplete: {problem}", where=str(entry),
                             fix="rebuild the artifact with `neuronpack compile --force`")
    return len(entries)
