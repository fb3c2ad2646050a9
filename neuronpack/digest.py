"""Content digests of files, cached by (path, size, mtime_ns, inode) so unchanged files are never re-read.

The cache lives in ``$NEURONPACK_CACHE_DIR`` (default ``~/.cache/neuronpack``) as ``digests.json``, replaced
atomically on every write. A cache write failure is never fatal: the digest is simply recomputed next time. A corrupt
cache file (truncated, not JSON, wrong types) is ignored entry by entry and rebuilt, never trusted; ``neuronpack gc``
prunes entries of files that are gone (``prune_digest_cache``).

Example::

    file_sha256(Path("model.safetensors"))   # reads the file once, then answers from the cache
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from neuronpack.fsutil import write_text_atomic

_CHUNK = 8 * 1024 * 1024
_lock = threading.Lock()
_memory: dict[str, dict] | None = None


def cache_dir() -> Path:
    root = os.environ.get("NEURONPACK_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "neuronpack"


def _cache_file() -> Path:
    return cache_dir() / "digests.json"


def _stat_key(path: Path) -> tuple[str, list[int]]:
    st = path.stat()
    return str(path.resolve()), [st.st_size, st.st_mtime_ns, st.st_ino]


def _valid_entries(data: object) -> dict[str, dict]:
    """The well-formed entries of a cache file's content; anything else (a truncated or hand-edited file, wrong types)
    is dropped, so a corrupt cache is rebuilt instead of trusted."""
    if not isinstance(data, dict):
        return {}
    return {key: entry for key, entry in data.items() if _valid_entry(entry)}


def _valid_entry(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    stat, digest = entry.get("stat"), entry.get("sha256")
    return (
        isinstance(stat, list) and len(stat) == 3 and all(type(v) is int for v in stat)
        and isinstance(digest, str) and len(digest) == 64 and not digest.strip("0123456789abcdef")
    )


def _read_cache_file() -> dict[str, dict]:
    try:
        return _valid_entries(json.loads(_cache_file().read_text()))
    except (OSError, ValueError, RecursionError):
        return {}


def _load() -> dict[str, dict]:
    global _memory
    if _memory is None:
        _memory = _read_cache_file()
    return _memory


def _store(cache: dict[str, dict]) -> None:
    """Replace the cache file atomically (temporary sibling + rename): a reader or a killed writer never leaves a
    partial file. A write failure (read-only home, full disk) is not fatal: digests are recomputed next time."""
    try:
        write_text_atomic(_cache_file(), json.dumps(cache, sort_keys=True))
    except OSError:
        pass


def sha256_stream(path: Path) -> str:
    """sha256 of a file's bytes, read in chunks (no caching)."""
    import hashlib  # here, not at the top: a warm cache never hashes (OpenSSL's load is ~2 ms of start-up)

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: Path, *, use_cache: bool = True) -> str:
    """sha256 of a file; answered from the stat-keyed cache when the file is unchanged."""
    path = Path(path)
    if not use_cache:
        return sha256_stream(path)
    key, stat = _stat_key(path)
    with _lock:
        entry = _load().get(key)
        if entry and entry["stat"] == stat:
            return entry["sha256"]
    digest = sha256_stream(path)
    with _lock:
        cache = _load()
        cache[key] = {"stat": stat, "sha256": digest}
        # Merge with what other processes wrote meanwhile, then replace atomically.
        _store({**_read_cache_file(), **cache})
    return digest


def prune_digest_cache() -> int:
    """Drop cache entries of files that are gone or changed since they were hashed; return how many were dropped.

    Example::

        prune_digest_cache()   # 3 (after deleting a model directory)
    """
    global _memory
    with _lock:
        cache = {**_read_cache_file(), **(_memory or {})}
        kept = {}
        for key, entry in cache.items():
            try:
                st = os.stat(key)
            except OSError:
                continue
            if [st.st_size, st.st_mtime_ns, st.st_ino] == entry["stat"]:
                kept[key] = entry
        dropped = len(cache) - len(kept)
        if dropped:
            _store(kept)
        _memory = kept
    return dropped


def canonical_json(obj: object) -> str:
    """Canonical JSON (sorted keys, no whitespace): the form every key and fingerprint is hashed in."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def sha256_json(obj: object) -> str:
    import hashlib

    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()
