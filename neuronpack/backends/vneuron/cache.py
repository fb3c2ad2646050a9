"""The plugin's compile cache on disk: which entries are complete (upstream's rule), and packaging them into an
artifact with only what a lookup reads.

Facts from vllm_neuron/compile/cache.py (0.21; the tests run that file on what this module writes):

- one entry per compiled graph, ``<root>/<32 hex>/``; it is complete (``_is_cache_complete``) when it holds
  ``graph.hlo``, ``graph_<entry name>.neff`` (``get_neff_filename``), ``.compilation_complete`` (written last by
  ``_store_local``) and at least one ``.artifact_metadata_v<N>.json`` of ANY version N;
- but the loader reads fewer: ``_build_cache_artifact`` loads the metadata through ``_load_artifact_metadata``, which
  tries only the versions of ``for version in [0]`` (0.21) and raises "Required artifact metadata missing from
  cache" when none parses, then requires its ``cache_key`` to equal the directory name. So an entry holding only
  ``.artifact_metadata_v1.json`` is complete for 0.21 and yet fails the pod's start: an entry is packaged only with
  metadata of a version its plugin's loader reads (``LOADER_METADATA``), and only those metadata files are packaged;
- the root also holds lock files (``.<key>.compilation_metadata`` and ``.lock``, with PIDs and command lines),
  entries hold ``.cache_accessed`` (rewritten on every hit) and debug files (``fxgraph.txt``, ``command.txt`` and
  ``log-neuron-cc.txt`` with absolute paths, ``hlo_passes/``, per-rank work directories): none is read by a lookup,
  so none is packaged;
- NKI kernel results live in ``<root>/nki/<key>.json`` (vllm_neuron/nki/nki_cache.py), fetched from the remote root's
  ``nki/`` the same way: packaged, without their ``.lock`` and ``.tmp.*`` files.

On the pod, ``fill_local_root`` makes the plugin's local root anew at every start from the (verified) artifact, so
every lookup is a local hit and nothing an earlier run left there (an altered NEFF, an entry compiled at start) is
ever served: docs/neuron.md, "The pod's local cache".

Example::

    packed = package_entries(work_root, staging / CACHE_DIR, (0,))
    packed.entries, packed.nki, packed.dropped     # 12, 0, 41
    fill_local_root(artifact / CACHE_DIR, plugin_root)   # ["0123...", ...]: the entries now local
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from neuronpack.artifacts.store import key_lock
from neuronpack.errors import ArtifactError, BuildError
from neuronpack.fsutil import make_staging_dir, remove_dead_staging, remove_tree

CACHE_DIR = "compile_cache"  # inside the artifact: the root handed to the plugin's remote-cache lookup
NKI_DIR = "nki"
HLO = "graph.hlo"
COMPLETE = ".compilation_complete"
_ENTRY_NAME = re.compile(r"[0-9a-f]{32}")
_METADATA = re.compile(r"\.artifact_metadata_v\d+\.json")
# plugin release -> the metadata versions its loader reads, in its order. 0.21: ``_load_artifact_metadata``'s
# ``for version in [0]`` (vllm_neuron/compile/cache.py). 0.24 moved the loader into libtorch-neuronx-lite, whose
# source is not readable here; its docs describe the 0.21 cache unchanged, so 0.24 is held to the same rule
# (docs/neuron.md says it is inferred, not read).
LOADER_METADATA: dict[str, tuple[int, ...]] = {"0.21.": (0,), "0.24.": (0,)}


@dataclass(frozen=True)
class PackedCache:
    entries: int  # complete graph entries packaged
    nki: int  # NKI kernel results packaged
    bytes: int
    dropped: int  # files left behind (locks, access markers, debug files with absolute paths)


def neff_name(entry_name: str) -> str:
    """``graph_<entry name>.neff``, the NEFF file name upstream looks for."""
    return f"graph_{entry_name}.neff"


def metadata_versions(plugin_version: str | None) -> tuple[int, ...]:
    """The ``.artifact_metadata_v<N>.json`` versions the loader of this plugin release reads (``LOADER_METADATA``).
    BuildError for a release neuronpack has no rule for."""
    for prefix, versions in LOADER_METADATA.items():
        if plugin_version and plugin_version.startswith(prefix):
            return versions
    raise BuildError(f"neuronpack does not know which cache metadata vllm-neuron {plugin_version} reads",
                     where="vllm-neuron", fix="build with vllm-neuron 0.21 or 0.24 (docs/neuron.md, support matrix)")


def metadata_name(version: int) -> str:
    return f".artifact_metadata_v{version}.json"


def entry_problem(entry: Path, versions: tuple[int, ...]) -> str | None:
    """Why ``entry`` is not an entry the plugin's loader accepts (complete by ``_is_cache_complete``, and metadata of
    one of ``versions`` whose ``cache_key`` is the directory's name), or None when it is one."""
    name = entry.name
    for required in (HLO, neff_name(name), COMPLETE):
        if not (entry / required).is_file():
            return f"it has no {required}" + (" (the compile did not finish)" if required == COMPLETE else "")
    for path in (entry / metadata_name(v) for v in versions):
        if not path.is_file():
            continue
        try:
            key = json.loads(path.read_text()).get("cache_key")
        except (OSError, ValueError, AttributeError):
            continue  # the loader skips an unreadable file and tries the next version
        return None if key == name else f"its {path.name} names cache key {key!r}, not the directory's"
    found = sorted(p.name for p in entry.iterdir() if _METADATA.fullmatch(p.name))
    wanted = " or ".join(metadata_name(v) for v in versions)
    return (f"it has no readable {wanted}, the only metadata the plugin's loader reads"
            + (f" (found {', '.join(found)})" if found else ""))


def entry_dirs(root: Path) -> list[Path]:
    """The graph entries under a cache root (32-hex directories; staging copies ``<key>.tmp.<pid>`` are not)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _ENTRY_NAME.fullmatch(p.name))


def package_entries(root: Path, dest: Path, versions: tuple[int, ...]) -> PackedCache:
    """Copy every entry of the cache ``root`` (and its NKI results) into ``dest``, keeping only the files a lookup
    reads (``versions``: the metadata versions the plugin's loader reads). BuildError when the root has no entry or
    any entry is not one the loader accepts: nothing half-built ships."""
    entries = entry_dirs(root)
    if not entries:
        raise BuildError("the plugin's CPU compile left no compile-cache entry", where=str(root),
                         fix="check the compile log: the model may not have reached graph capture")
    for entry in entries:
        problem = entry_problem(entry, versions)
        if problem is not None:
            raise BuildError(f"compile-cache entry {entry.name} cannot be packaged: {problem}", where=str(entry),
                             fix="rerun the compile; an entry is packaged only once upstream marks it complete, with "
                                 "metadata its loader reads")
    total = kept = 0
    for entry in entries:
        metadata = {metadata_name(v) for v in versions if (entry / metadata_name(v)).is_file()}
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


def check_packaged(cache: Path, versions: tuple[int, ...]) -> int:
    """The number of entries in an artifact's packaged cache; ArtifactError when one is not an entry the plugin's
    loader accepts (a changed artifact: verify's file check catches edits, this catches one packaged wrongly)."""
    entries = entry_dirs(cache)
    for entry in entries:
        problem = entry_problem(entry, versions)
        if problem is not None:
            raise ArtifactError(f"packaged cache entry {entry.name} is not loadable: {problem}", where=str(entry),
                                fix="rebuild the artifact with `neuronpack compile --force`")
    return len(entries)


def fill_local_root(packaged: Path, root: Path) -> list[str]:
    """Make the plugin's local cache ``root`` a fresh copy of an artifact's ``packaged`` cache (entries and NKI
    results), replacing whatever was there; the names of the entries. The copy is built beside ``root`` and swapped
    in with two renames, so a server of the same artifact already running keeps finding every entry. The copies
    are ordinary files of this user (the plugin writes ``.cache_accessed`` into an entry on every hit)."""
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    with key_lock(root.parent, f".{root.name}"):  # two servers of one artifact starting at once take turns
        return _fill(packaged, root)


def _fill(packaged: Path, root: Path) -> list[str]:
    label = f"{root.name}-"
    remove_dead_staging(root.parent, label)
    staging = make_staging_dir(root.parent, f"{label}pid{os.getpid()}-")
    try:
        for source in [*entry_dirs(packaged), packaged / NKI_DIR]:
            if source.is_dir():  # entries are flat; no mode is copied (an artifact's are read-only)
                (staging / source.name).mkdir()
                for path in source.iterdir():
                    shutil.copyfile(path, staging / source.name / path.name)
        old = None
        if root.exists():
            old = make_staging_dir(root.parent, f"{label}pid{os.getpid()}-old-") / "old"
            os.rename(root, old)
        os.rename(staging, root)
    except BaseException:
        remove_tree(staging)
        raise
    if old is not None:
        remove_tree(old.parent)
    return [entry.name for entry in entry_dirs(root)]
