"""The pods' writable directories ($TMPDIR/neuronpack-vllm/<key>, artifacts/pod_caches.py) and gc: one a pod holds is
never listed nor removed; one whose artifact is gone (or goes in the same gc) is; a pod that starts while gc removes
its directory waits, then makes a fresh one. (The pod's own start, as another user, is tests/backends/vneuron.)"""

from __future__ import annotations

import json
import os
import tempfile
import threading

import pytest

from neuronpack.artifacts.listing import plan_gc, run_gc
from neuronpack.artifacts.pod_caches import (
    LOCK,
    RECORD,
    pod_cache_base,
    pod_cache_in_use,
    remove_pod_cache,
    unused_pod_caches,
)
from neuronpack.pipeline import compile_model
from tests.pipeline.builds import FAST, RECIPE


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """tempfile's directory (where pods keep theirs) is this test's own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path / "tmp"


def test_a_held_directory_is_kept_and_a_gone_artifacts_is_removed(temp_root, tmp_path):
    base = pod_cache_base("a" * 64)
    assert base == temp_root / "neuronpack-vllm" / ("a" * 64)
    with pod_cache_in_use(base, tmp_path / "gone-artifact"):
        (base / "neuron").mkdir()
        assert json.loads((base / RECORD).read_text()) == {"artifact": str(tmp_path / "gone-artifact")}
        assert unused_pod_caches(lambda artifact: True) == []  # a pod runs there
        assert remove_pod_cache(base) is False and base.is_dir()
    [(found, reason)] = unused_pod_caches(lambda artifact: not artifact.exists())
    assert found == base and reason == f"its artifact {tmp_path / 'gone-artifact'} is gone, and no pod uses it"
    assert unused_pod_caches(lambda artifact: False) == []  # an artifact still there keeps its directory
    assert remove_pod_cache(base) is True and not base.exists()
    assert os.listdir(temp_root / "neuronpack-vllm") == []  # the renamed copy went too

    older = pod_cache_base("b" * 64)
    (older / "neuron").mkdir(parents=True)  # an older neuronpack's: no record, no lock
    assert [b for b, _ in unused_pod_caches(lambda artifact: False)] == [older]


def test_a_pod_starting_while_gc_removes_its_directory_makes_a_fresh_one(temp_root, tmp_path):
    base = pod_cache_base("c" * 64)
    with pod_cache_in_use(base, tmp_path / "art"):
        pass
    fd = os.open(base / LOCK, os.O_RDWR)
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)  # what remove_pod_cache holds while it renames the directory away
    started, held = threading.Event(), {}

    def pod() -> None:
        started.set()
        with pod_cache_in_use(base, tmp_path / "art") as where:
            held["inode"] = os.stat(where / LOCK).st_ino

    thread = threading.Thread(target=pod)
    thread.start()
    started.wait()
    os.rename(base, temp_root / "neuronpack-vllm" / "trash")
    os.close(fd)  # gc done: the pod took the lock of a removed file, sees it, and starts over
    thread.join(10)
    assert not thread.is_alive() and (base / RECORD).is_file()
    assert held["inode"] != os.stat(temp_root / "neuronpack-vllm" / "trash" / LOCK).st_ino


def test_gc_removes_the_pod_directory_of_an_artifact_it_removes(temp_root, tiny_llama, tmp_path):
    root = tmp_path / "root"
    old = compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=root)
    new = compile_model(str(tiny_llama), recipe=RECIPE, overrides=[*FAST, "target.batch_size=3"], out_root=root)
    for built in (old, new):
        with pod_cache_in_use(pod_cache_base(built.key), built.path):
            pass
    store = root / "neuron-compiled-artifacts"
    items = plan_gc(store, keep=1)
    assert [(i.kind, i.path.name) for i in items] == [("artifact", old.key), ("pod-cache", old.key)]
    run_gc(items)
    assert not pod_cache_base(old.key).exists() and pod_cache_base(new.key).is_dir()
