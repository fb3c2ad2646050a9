"""One rule for an artifact's file modes (artifacts/modes.py), whether a build published it or a pull installed it.

A Neuron artifact built here used to be published read-only (write bits cleared) while the same key pulled from a
remote store came down writable (0755 / 0644), open to vLLM's compile-in-place fallback. The unprivileged checks run
as root without capabilities (setpriv): the permission bits then apply as they do to any user, and 0555 / 0444 give
every user the same bits.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from neuronpack.artifacts.modes import set_published_modes
from neuronpack.artifacts.remote import open_transport
from neuronpack.artifacts.remote.pull import pull_artifact
from neuronpack.artifacts.remote.push import push_artifact
from neuronpack.pipeline import compile_model
from tests.backends.neuron_standin import fixtures as standin

nxd_sdk, sdk_path = standin.nxd_sdk, standin.sdk_path  # fixtures
NXD = ["target.framework=nxd", "target.instance=inf2", "target.tp_degree=2", "target.batch_size=2",
       "target.seq_len=256", "target.max_context_length=128", "model.dtype=bfloat16"]
SETPRIV = shutil.which("setpriv")
UNPRIVILEGED = [SETPRIV, "--inh-caps=-all", "--bounding-set=-all"] if SETPRIV else []


def modes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


@pytest.mark.contract
def test_a_built_and_a_pulled_neuron_artifact_get_the_same_read_only_modes(tiny_llama, tmp_path, nxd_sdk):
    built = compile_model(str(tiny_llama), overrides=NXD, out_root=tmp_path / "build").path
    store = open_transport(f"file://{tmp_path / 'store'}")
    push_artifact(built, store)
    pulled = pull_artifact(store, built.name, tmp_path / "pod" / "neuron-compiled-artifacts" / built.name).path
    assert modes(pulled) == modes(built)
    assert {mode for rel, mode in modes(built).items() if (built / rel).is_dir()} == {0o555}
    assert {mode for rel, mode in modes(built).items() if (built / rel).is_file()} == {0o444}


def test_a_torch_artifact_keeps_the_modes_it_was_written_with(tmp_path):
    (tmp_path / "art" / "weights").mkdir(parents=True)
    (tmp_path / "art" / "weights" / "model.safetensors").write_bytes(b"x")
    before = modes(tmp_path / "art")
    set_published_modes(tmp_path / "art", "torch")
    assert modes(tmp_path / "art") == before


@pytest.mark.contract
@pytest.mark.skipif(not UNPRIVILEGED, reason="needs util-linux setpriv")
def test_an_unprivileged_user_reads_either_and_writes_into_neither(tiny_llama, tmp_path, nxd_sdk):
    built = compile_model(str(tiny_llama), overrides=NXD, out_root=tmp_path / "build").path
    store = open_transport(f"file://{tmp_path / 'store'}")
    push_artifact(built, store)
    pulled = pull_artifact(store, built.name, tmp_path / "pod" / "neuron-compiled-artifacts" / built.name).path
    for art in (built, pulled):
        verified = subprocess.run([*UNPRIVILEGED, sys.executable, "-m", "neuronpack", "verify", str(art),
                                   "--no-env-check"], capture_output=True, text=True)
        assert verified.returncode == 0, verified.stderr  # every file read and hashed
        for attempt in (f"open({str(art / 'model.pt')!r}, 'ab')", f"open({str(art / 'new.txt')!r}, 'w')"):
            wrote = subprocess.run([*UNPRIVILEGED, sys.executable, "-c", attempt], capture_output=True, text=True)
            assert wrote.returncode != 0 and "PermissionError" in wrote.stderr, (art, attempt)
