"""gc under SIGKILL (artifacts disappear whole or not at all; the next gc finishes the job), gc pruning the digest
cache, and the digest cache surviving corruption (rebuilt, never trusted) and kills (always a whole JSON file)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from neuronpack import digest
from neuronpack.artifacts.store import artifacts_root
from neuronpack.artifacts.verify import quick_check
from neuronpack.digest import file_sha256, sha256_stream
from neuronpack.pipeline.verify import verify_artifact
from tests.pipeline.builds import RECIPE

from .killpoints import kill_sweep

KEYS = [f"{i:x}" * 64 for i in range(1, 4)]  # three copies of one artifact under distinct key-shaped names
INVALID = "f" * 64


@pytest.mark.timeout(900)
def test_sigkill_during_gc(tmp_path, fault_artifact):
    root = tmp_path / "root"
    store = artifacts_root(root)

    def populate() -> None:
        """Top the store up (leftovers of a killed gc stay): 3 artifacts, an invalid dir, a dead build's staging dir
        and a failed-build log."""
        for key in KEYS:
            if not (store / key).exists():
                shutil.copytree(fault_artifact.path, store / key)
        (store / INVALID).mkdir(exist_ok=True)
        (store / INVALID / "half-written.bin").write_bytes(b"x" * 100)
        (store / ".staging" / ".neuronpack-staging-0123456789abcdef-999999999-abc").mkdir(parents=True, exist_ok=True)
        (store / ".failed").mkdir(exist_ok=True)
        (store / ".failed" / "old.log").write_text("boom")

    def check() -> None:
        """Every visible artifact directory is complete (or is the planted invalid one, intact or gone)."""
        for path in store.iterdir():
            if path.name.startswith(".") or path.name == INVALID:
                continue
            assert quick_check(path) is not None, f"half-deleted artifact visible: {path.name}"

    sweep = kill_sweep(["gc", "--root", str(root), "--keep", "1"], root=tmp_path, check=check, reset=lambda: None,
                       before_each=populate)
    # The final, uninterrupted gc removed everything it should, including the trash of the killed ones.
    visible = [p.name for p in store.iterdir() if not p.name.startswith(".")]
    assert len(visible) == 1 and quick_check(store / visible[0]) is not None
    verify_artifact(store / visible[0])
    assert list((store / ".staging").iterdir()) == [] and list((store / ".failed").iterdir()) == []
    assert sweep.killed >= 2
    print(f"gc: {sweep.markers} markers, killed at {sweep.kill_points} ({sweep.killed} kills): {sweep.labels}")


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuronpack", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_gc_prunes_digest_cache_entries_of_files_that_are_gone(tmp_path):
    cache = tmp_path / "cache"
    files = [tmp_path / f"w{i}.bin" for i in range(3)]
    for i, f in enumerate(files):
        f.write_bytes(bytes([i]) * 1000)
    code = "import sys\nfrom pathlib import Path\nfrom neuronpack.digest import file_sha256\n" \
           "for f in sys.argv[1:]: file_sha256(Path(f))"
    subprocess.run([sys.executable, "-c", code, *map(str, files)], check=True,
                   env={**os.environ, "NEURONPACK_CACHE_DIR": str(cache)})
    assert len(json.loads((cache / "digests.json").read_text())) == 3
    files[0].unlink()
    files[1].write_bytes(b"changed")  # stale entry: size and mtime differ
    result = cli("gc", "--root", str(tmp_path / "root"), "--format", "json",
                 env={"NEURONPACK_CACHE_DIR": str(cache)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["digest_cache_pruned"] == 2
    assert list(json.loads((cache / "digests.json").read_text())) == [str(files[2].resolve())]
    dry = cli("gc", "--root", str(tmp_path / "root"), "--dry-run", "--format", "json",
              env={"NEURONPACK_CACHE_DIR": str(cache)})
    assert json.loads(dry.stdout)["digest_cache_pruned"] == 0


CORRUPT = {
    "truncated": lambda good: good[: len(good) // 2],
    "garbage": lambda good: "\x00\xff garbage {{{",
    "a list": lambda good: "[1, 2, 3]",
    "a number": lambda good: "42",
    "deeply nested": lambda good: "[" * 100_000,
    "wrong entry types": lambda good: json.dumps({k: "x" for k in json.loads(good)}),
    "wrong field types": lambda good: json.dumps(
        {k: {"stat": str(v["stat"]), "sha256": 5} for k, v in json.loads(good).items()}),
    "malformed digest": lambda good: json.dumps(
        {k: {"stat": v["stat"], "sha256": "not-a-digest"} for k, v in json.loads(good).items()}),
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_corrupt_digest_cache_is_rebuilt_not_trusted(tmp_path, monkeypatch, kind):
    """Before: a list or number in digests.json crashed with AttributeError, an entry with wrong types crashed or was
    returned as the digest ("sha256": 5). Now every malformed entry is ignored and the file is rewritten whole."""
    monkeypatch.setenv("NEURONPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(digest, "_memory", None)
    weights = tmp_path / "w.bin"
    weights.write_bytes(os.urandom(4096))
    truth = sha256_stream(weights)
    assert file_sha256(weights) == truth
    cache_file = tmp_path / "cache" / "digests.json"
    cache_file.write_text(CORRUPT[kind](cache_file.read_text()))
    monkeypatch.setattr(digest, "_memory", None)  # a new process
    assert file_sha256(weights) == truth
    rebuilt = json.loads(cache_file.read_text())
    assert rebuilt == {str(weights.resolve()): {"stat": rebuilt[str(weights.resolve())]["stat"], "sha256": truth}}


def test_digest_cache_write_failure_is_not_fatal(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("a file where the cache directory should be")
    monkeypatch.setenv("NEURONPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(digest, "_memory", None)
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"abc")
    assert file_sha256(weights) == sha256_stream(weights)


@pytest.mark.timeout(600)
def test_sigkill_while_writing_the_digest_cache_leaves_a_whole_file(tmp_path, tiny_llama):
    """`compile --dry-run` hashes every weight and tokenizer file and writes digests.json after each: killed at any
    of those writes, the cache file is absent or a whole, valid JSON object (temporary sibling + rename)."""
    cache = tmp_path / "cache"

    def check() -> None:
        path = cache / "digests.json"
        if path.exists():
            data = json.loads(path.read_text())
            assert data and all(digest._valid_entry(e) for e in data.values())

    sweep = kill_sweep(["compile", str(tiny_llama), "--recipe", str(RECIPE), "--dry-run", "--quiet",
                        "--out-root", str(tmp_path / "root")],
                       root=tmp_path, check=check, reset=lambda: shutil.rmtree(cache, ignore_errors=True),
                       env={"NEURONPACK_CACHE_DIR": str(cache)})
    assert sweep.killed >= 2
    print(f"digest cache: {sweep.markers} markers, killed at {sweep.kill_points}: {sweep.labels}")
