"""Graph reuse through a remote store: CI pushes a build, a fresh build box with --remote compiles a fine-tune of the
same model by downloading only the donor's compiled graphs (found through the store's graph index), never its
weights; against a real S3 server (moto) and a shared filesystem."""

from __future__ import annotations

from pathlib import Path

from neuronpack.artifacts.remote import open_transport
from neuronpack.artifacts.remote.graph_index import index_path
from neuronpack.artifacts.remote.push import push_artifact
from neuronpack.pipeline import compile_model, verify_artifact
from tests.helpers.tiny_models import fine_tune_copy
from tests.runtime.serving import EXPORT, RECIPE, SERVE_OVERRIDES

SETS = [*SERVE_OVERRIDES, *EXPORT]


class Recorded:
    """A real transport whose downloads are written down (every call goes to the store)."""

    def __init__(self, transport) -> None:
        self._transport, self.downloaded = transport, []

    def download(self, path, local, *, on_bytes):
        self.downloaded.append(path)
        return self._transport.download(path, local, on_bytes=on_bytes)

    def __getattr__(self, name):
        return getattr(self._transport, name)


def test_a_fresh_build_box_takes_only_the_graphs_from_the_store(any_store, tiny_llama, tmp_path):
    ci = compile_model(str(tiny_llama), recipe=RECIPE, overrides=SETS, out_root=tmp_path / "ci")
    transport = open_transport(any_store)
    assert push_artifact(ci.path, transport).pushed
    assert transport.stat(index_path(ci.manifest.graphs["key"], ci.key)) is not None  # indexed by push

    tuned = fine_tune_copy(tiny_llama, tmp_path / "fine-tune")
    recorded = Recorded(transport)
    box = compile_model(str(tuned), recipe=RECIPE, overrides=SETS, out_root=tmp_path / "box", remote=recorded,
                        push=True)
    assert not box.remote_hit and box.key != ci.key
    assert box.graphs_from == {"key": ci.key, "source": transport.url, "files": 1,
                               "bytes": (ci.path / "graphs.pt2").stat().st_size,
                               "compile_seconds_saved": ci.manifest.graphs["seconds"]}
    assert recorded.downloaded == [f"{ci.key}/graphs.pt2"]  # not one byte of the donor's weights
    assert not (tmp_path / "box" / "neuron-compiled-artifacts" / ci.key).exists()
    assert verify_artifact(box.path).key == box.key
    assert (box.path / "graphs.pt2").read_bytes() == (ci.path / "graphs.pt2").read_bytes()
    # pushed in turn, and indexed: the next fine-tune can take its graphs as well
    assert box.pushed["pushed"] and transport.stat(index_path(box.manifest.graphs["key"], box.key)) is not None


def test_a_stale_index_entry_is_skipped(any_store, tiny_llama, tmp_path):
    transport = open_transport(any_store)
    ci = compile_model(str(tiny_llama), recipe=RECIPE, overrides=SETS, out_root=tmp_path / "ci")
    push_artifact(ci.path, transport)
    # the artifact is collected from the store, its index entry left behind
    transport.delete([o.path for o in transport.list_files(ci.key)])
    box = compile_model(str(fine_tune_copy(tiny_llama, tmp_path / "ft")), recipe=RECIPE, overrides=SETS,
                        out_root=tmp_path / "box", remote=transport)
    assert box.graphs_from is None and box.manifest.build["bucket_seconds"]
    assert Path(box.path).is_dir()


def test_gc_remote_takes_an_artifacts_index_entry_with_it(any_store, tiny_llama, tmp_path):
    from neuronpack.artifacts.remote.listing import plan_remote_gc, run_remote_gc

    transport = open_transport(any_store)
    ci = compile_model(str(tiny_llama), recipe=RECIPE, overrides=SETS, out_root=tmp_path / "ci")
    push_artifact(ci.path, transport)
    entry = index_path(ci.manifest.graphs["key"], ci.key)
    (item,) = plan_remote_gc(transport, keep=0)
    assert entry in item.paths and item.size == ci.manifest.total_size  # the index entry adds no size
    run_remote_gc(transport, [item])
    assert transport.stat(entry) is None and transport.list_files(ci.key) == []
