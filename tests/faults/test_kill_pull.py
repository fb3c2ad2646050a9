"""SIGKILL `pull` (from a file:// remote store) at progress markers: the artifact is never visible half-downloaded
(its directory is absent or complete and verifies), and the next pull succeeds (resuming what a killed one left)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from neuronpack.artifacts.store import artifacts_root
from neuronpack.artifacts.verify import quick_check
from neuronpack.pipeline.verify import verify_artifact

from .killpoints import kill_sweep


@pytest.mark.timeout(900)
def test_sigkill_during_pull(tmp_path, fault_artifact):
    remote = tmp_path / "remote"
    push = subprocess.run([sys.executable, "-m", "neuronpack", "push", str(fault_artifact.path),
                           f"file://{remote}"], capture_output=True, text=True, timeout=300)
    assert push.returncode == 0, push.stderr
    root = tmp_path / "root"
    store = artifacts_root(root)
    key = fault_artifact.key

    def check() -> None:
        visible = [p for p in store.iterdir() if not p.name.startswith(".")] if store.is_dir() else []
        assert [p.name for p in visible] in ([], [key]), visible
        if visible:
            assert quick_check(visible[0], key) is not None, "half-pulled artifact visible"
            verify_artifact(visible[0])

    sweep = kill_sweep(["pull", key, "--from", f"file://{remote}", "--root", str(root), "--progress", "none"],
                       root=tmp_path, check=check, reset=lambda: shutil.rmtree(store / key, ignore_errors=True))
    assert (store / key).is_dir()
    assert sweep.killed >= 2
    print(f"pull: {sweep.markers} markers, killed at {sweep.kill_points} ({sweep.killed} kills): {sweep.labels}")
