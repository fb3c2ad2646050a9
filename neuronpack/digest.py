"""Content digests of files, cached by (path, size, mtime_ns, inode) so unchanged files are never re-read.

The cache lives in ``$NEURONPACK_CACHE_DIR`` (default ``~/.cache/neuronpack``) as ``digests.json``. A cache write
failure is never fatal: the digest is simply recomputed next time.

Example::

    file_sha256(Path("model.safetensors"))   # reads the file once, then answers from the cache
"""

from __future__ import annotations

import hashlib
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


def _load() -> dict[str, dict]:
    global _memory
    if _memory is None:
        try:
            _memory = json.loads(_cache_file().read_text())
        except (OSError, ValueError):
            _memory = {}
    return _memory


def sha256_stream(path: Path) -> str:
    """sha256 of a file's bytes, read in chunks (no caching)."""
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
        if entry and entry.get("stat") == stat:
            return entry["sha256"]
    digest = sha256_stream(path)
    with _lock:
        cache = _load()
        cache[key] = {"stat": stat, "sha256": digest}
        try:
            # Merge with what other processes wrote meanwhile, then replace atomically.
            try:
                on_disk = json.loads(_cache_file().read_text())
            except (OSError, ValueError):
                on_disk = {}
            on_disk.update(cache)
            write_text_atomic(_cache_file(), json.dumps(on_disk, sort_keys=True))
        except OSError:
            pass
    return digest


def canonical_json(obj: object) -> str:
    """Canonical JSON (sorted keys, no whitespace): the form every key and fingerprint is hashed in."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def sha256_json(obj: object) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()
