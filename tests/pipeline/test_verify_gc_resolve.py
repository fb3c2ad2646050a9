"""verify names the first problem; gc cleans what it should; NEURON_COMPILED_ARTIFACTS falls back both ways."""

import json
import os
import shutil
import time

import pytest

from neuronpack.artifacts.key import compute_key
from neuronpack.artifacts.listing import list_artifacts, parse_duration, plan_gc, run_gc
from neuronpack.artifacts.manifest import MANIFEST_NAME, read_manifest
from neuronpack.artifacts.store import artifacts_root
from neuronpack.errors import ArtifactError, NeuronpackError, ServeError
from neuronpack.pipeline import resolve_serving_artifact, verify_artifact
from tests.pipeline.builds import FAST, RECIPE


def weights_file(artifact):
    return next(p for p in (artifact / "weights").iterdir() if p.suffix == ".safetensors")


def test_corrupted_file_same_size(artifact_copy):
    target = weights_file(artifact_copy)
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="does not match its sha256"):
        verify_artifact(artifact_copy)


def test_truncated_file(artifact_copy):
    target = weights_file(artifact_copy)
    target.write_bytes(target.read_bytes()[:-10])
    with pytest.raises(ArtifactError, match="bytes, the manifest says"):
        verify_artifact(artifact_copy)


def test_missing_file(artifact_copy):
    (artifact_copy / "neuron_config.json").unlink()
    with pytest.raises(ArtifactError, match="file neuron_config.json is missing"):
        verify_artifact(artifact_copy)


def test_unlisted_file(artifact_copy):
    (artifact_copy / "extra.txt").write_text("x")
    with pytest.raises(ArtifactError, match="not in the manifest"):
        verify_artifact(artifact_copy)


def test_edited_manifest(artifact_copy):
    manifest = json.loads((artifact_copy / MANIFEST_NAME).read_text())
    manifest["key_inputs"]["compile"]["target"]["batch_size"] = 64
    (artifact_copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="manifest was edited"):
        verify_artifact(artifact_copy)


def test_missing_or_broken_manifest(artifact_copy):
    (artifact_copy / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        verify_artifact(artifact_copy)
    (artifact_copy / MANIFEST_NAME).unlink()
    with pytest.raises(ArtifactError, match="unfinished build"):
        verify_artifact(artifact_copy)


def test_other_toolchain_is_refused_naming_both_versions(artifact_copy):
    manifest = json.loads((artifact_copy / MANIFEST_NAME).read_text())
    here = manifest["versions"]["torch"]
    manifest["key_inputs"]["versions"]["torch"] = manifest["versions"]["torch"] = "2.0.0"
    manifest["key"] = compute_key(manifest["key_inputs"])
    (artifact_copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError) as info:
        verify_artifact(artifact_copy)
    assert f"built with torch 2.0.0, this machine has {here}" in info.value.one_line()
    verify_artifact(artifact_copy, check_env=False)


def test_ls_and_gc(built_artifact, tiny_llama, tmp_path):
    root = tmp_path / "root"
    store = artifacts_root(root)
    shutil.copytree(built_artifact.path, store / built_artifact.path.name)
    stale = store / ("0" * 64)
    stale.mkdir()
    (stale / "half-written.bin").write_bytes(b"x" * 100)
    leftover = store / ".staging" / ".neuronpack-staging-0123456789abcdef-999999999-abc"
    leftover.mkdir(parents=True)
    (store / ".failed").mkdir()
    (store / ".failed" / "old.log").write_text("boom")
    rows = list_artifacts(store)
    assert [r["key"] for r in rows] == [built_artifact.key]
    assert rows[0]["framework"] == "torch" and rows[0]["size"] > 0

    planned = plan_gc(store)
    assert {i.kind for i in planned} == {"invalid", "staging", "failed-log"}
    assert stale.exists() and leftover.exists()  # planning removes nothing (dry run)
    run_gc(planned)
    assert not stale.exists() and not leftover.exists() and not (store / ".failed" / "old.log").exists()
    assert list_artifacts(store)

    assert [i.kind for i in plan_gc(store, keep=1)] == []
    assert [i.kind for i in plan_gc(store, keep=0)] == ["artifact"]
    time.sleep(0.01)
    assert [i.kind for i in plan_gc(store, older_than=0.001)] == ["artifact"]
    assert plan_gc(store, older_than=parse_duration("7d")) == []


def test_gc_spares_the_staging_dir_of_a_live_build(tmp_path):
    store = artifacts_root(tmp_path)
    live = store / ".staging" / f".neuronpack-staging-0123456789abcdef-{os.getpid()}-abc"
    live.mkdir(parents=True)
    assert plan_gc(store) == []


def test_parse_duration():
    assert parse_duration("90s") == 90 and parse_duration("2h") == 7200 and parse_duration("1w") == 604800
    with pytest.raises(NeuronpackError, match="cannot read duration"):
        parse_duration("soon")


def test_resolve_uses_a_valid_env_artifact(built_artifact, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILED_ARTIFACTS", str(built_artifact.path))
    assert resolve_serving_artifact(None) == built_artifact.path


def test_resolve_compiles_into_a_missing_env_path(tiny_llama, tmp_path, monkeypatch):
    target = tmp_path / "served" / "artifact"
    monkeypatch.setenv("NEURON_COMPILED_ARTIFACTS", str(target))
    path = resolve_serving_artifact(None, model=str(tiny_llama), recipe=RECIPE, overrides=FAST)
    assert path == target
    assert read_manifest(target).framework == "torch"
    verify_artifact(target)


def test_resolve_recompiles_an_invalid_env_artifact(artifact_copy, tiny_llama, monkeypatch):
    weights_file(artifact_copy).write_bytes(b"garbage")
    monkeypatch.setenv("NEURON_COMPILED_ARTIFACTS", str(artifact_copy))
    path = resolve_serving_artifact(None, model=str(tiny_llama), recipe=RECIPE, overrides=FAST)
    assert path == artifact_copy
    verify_artifact(artifact_copy)


def test_resolve_errors_without_a_way_to_compile(tmp_path, monkeypatch):
    with pytest.raises(ServeError, match="no artifact to serve"):
        resolve_serving_artifact(None)
    monkeypatch.setenv("NEURON_COMPILED_ARTIFACTS", str(tmp_path / "missing"))
    with pytest.raises(ServeError, match="is not a valid artifact") as raised:
        resolve_serving_artifact(None)
    assert raised.value.one_line().count(str(tmp_path / "missing")) == 1  # the path once, not the inner error's too
    with pytest.raises(ArtifactError, match="does not exist"):
        resolve_serving_artifact(tmp_path / "nope")
