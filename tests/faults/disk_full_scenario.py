"""Inside a private mount namespace with a small tmpfs at ROOT (see test_disk_full.py): put one valid artifact in the
store, run `neuronpack compile` of another key into the same store, and print what the store held before and after.

Usage: python disk_full_scenario.py ROOT ARTIFACT_DIR -- compile-args...   (prints one JSON object)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def snapshot(store: Path) -> dict[str, str]:
    """Every file below the store (locks and failed-build logs aside) with its sha256."""
    out = {}
    for path in sorted(p for p in store.rglob("*") if p.is_file()):
        rel = path.relative_to(store).as_posix()
        if not rel.startswith((".locks/", ".failed/")):
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def main() -> None:
    root, artifact = Path(sys.argv[1]), Path(sys.argv[2])
    args = sys.argv[sys.argv.index("--") + 1:]
    store = root / "neuron-compiled-artifacts"
    shutil.copytree(artifact, store / artifact.name)
    before = snapshot(store)
    free_before = shutil.disk_usage(root).free
    result = subprocess.run([sys.executable, "-m", "neuronpack", *args, "--out-root", str(root)], capture_output=True,
                            text=True, env={**os.environ, "NEURONPACK_DEBUG": "0"})
    print(json.dumps({"returncode": result.returncode, "stderr": result.stderr, "before": before,
                      "after": snapshot(store), "free_before": free_before, "free_after": shutil.disk_usage(root).free,
                      "failed_logs": sorted(p.name for p in (store / ".failed").glob("*")) if (store / ".failed")
                      .is_dir() else []}))


if __name__ == "__main__":
    main()
