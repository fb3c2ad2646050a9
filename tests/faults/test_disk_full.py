"""A full disk while a compile builds and publishes: the store stays as it was (the existing artifact untouched and
still valid, no new or half-written directory, no staging left) and the command fails with one clear line.

Two ways to fill the disk:
- a real one: a small tmpfs mounted in a private mount namespace (``unshare``; as root, or through a user namespace
  otherwise) holding the artifact root, with a few free-space sizes so the write that fails lands at different
  stages of the build; the namespace (and the mount) disappears with the process;
- an injected ENOSPC at each step of publishing itself (writing the manifest, fsyncing, the failure log), where a
  tmpfs cannot aim.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neuronpack import fsutil
from neuronpack.artifacts import manifest as manifest_module
from neuronpack.artifacts import store as store_module
from neuronpack.artifacts.store import artifacts_root
from neuronpack.errors import NeuronpackError
from neuronpack.fsutil import dir_size
from neuronpack.pipeline import compile_model
from neuronpack.pipeline.verify import verify_artifact
from tests.pipeline.builds import RECIPE

SCENARIO = Path(__file__).with_name("disk_full_scenario.py")
OTHER_KEY = ["--set", "compiler=export", "--set", "buckets.context=[32]"]  # a second key beside the stored one


def _unshare_prefix() -> list[str] | None:
    """The unshare command that gives us a private mount namespace here, or None."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return None
    prefix = ["unshare", "--mount", "--propagation", "private"] if os.geteuid() == 0 else \
        ["unshare", "--user", "--map-root-user", "--mount"]
    probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || "
                            "mount -t tmpfs -o size=64k tmpfs \"$0\"", "/tmp"], capture_output=True)
    return prefix if probe.returncode == 0 else None


def _run_on_small_disk(tmp_path: Path, artifact: Path, model: Path, free_bytes: int) -> dict:
    prefix = _unshare_prefix()
    if prefix is None:
        pytest.skip("cannot mount a tmpfs in a private mount namespace here (no unshare/user namespaces)")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    size = dir_size(artifact) + 256 * 1024 + free_bytes  # the artifact, directory/inode overhead, then the free room
    script = 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"'
    cmd = [*prefix, "sh", "-c", script, "sh", str(size), str(mount_point), sys.executable, str(SCENARIO),
           str(mount_point), str(artifact), "--", "compile", str(model), "--recipe", str(RECIPE), *OTHER_KEY,
           "--quiet"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.6], ids=["no-room", "30pct-room", "60pct-room"])
def test_full_disk_during_compile_leaves_the_store_as_it_was(tmp_path, fault_artifact, tiny_llama, fraction):
    """Before: with room for part of the build, torch's archive writer failed with "unexpected pos" and then aborted
    the process (SIGABRT) from its destructor after the error line."""
    needed = dir_size(fault_artifact.path)  # the stored artifact's size; the new one (fewer buckets) is a bit smaller
    run = _run_on_small_disk(tmp_path, fault_artifact.path, tiny_llama, int(needed * fraction))
    if run["returncode"] == 0:  # it fitted: the old artifact is untouched beside the new one
        assert run["before"].items() <= run["after"].items()
        print(f"free {int(needed * fraction)} of {needed} bytes: fitted")
        return
    assert run["returncode"] == 1, run
    lines = [ln for ln in run["stderr"].splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), run["stderr"]
    assert "no space left on device" in lines[0].lower(), lines[0]
    assert "Traceback" not in run["stderr"]
    assert run["after"] == run["before"], "the store changed"
    print(f"free {int(needed * fraction)} of {needed} bytes: {lines[0]}")


@pytest.mark.parametrize("step", ["manifest", "fsync"])
def test_injected_enospc_while_publishing(tmp_path, fault_artifact, tiny_llama, monkeypatch, step):
    """ENOSPC from one publishing step (writing the manifest, fsyncing the staged tree before the rename) and from
    the failure log too (the disk is full for it as well): one clear error, and the store keeps exactly the artifact
    it had. Before: the failure log's own OSError escaped from the error handler as a traceback."""
    root = tmp_path / "root"
    store = artifacts_root(root)
    shutil.copytree(fault_artifact.path, store / fault_artifact.path.name)

    def visible() -> list[str]:
        return sorted(p.relative_to(store).as_posix() for p in store.rglob("*")
                      if not p.relative_to(store).as_posix().startswith((".staging", ".locks", ".failed")))

    before = visible()

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store_module, "write_text_atomic", full)  # the failure log
    if step == "manifest":
        monkeypatch.setattr(manifest_module, "write_text_atomic", full)
    else:
        monkeypatch.setattr(fsutil, "fsync_tree", full)
    with pytest.raises(NeuronpackError) as info:
        compile_model(str(tiny_llama), recipe=RECIPE, overrides=OTHER_KEY[1::2], out_root=root)
    line = info.value.one_line()
    assert "no space left on device" in line.lower() and "\n" not in line, line
    assert visible() == before
    assert not any((store / ".staging").iterdir())
    verify_artifact(store / fault_artifact.path.name)
