"""Untrusted artifacts (artifacts/paths.py): a manifest naming a file outside the artifact (``..``, an absolute path)
or any symlink in the artifact is refused by verify, by the cache-hit check and by serve's loading path, with one
clear line. Before: a '..' or absolute name and a symlink to a file or directory outside verified as valid (the
escaping file had the recorded size and sha256); only files the torch backend itself requires were caught, by luck."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neuronpack.artifacts.manifest import MANIFEST_NAME
from neuronpack.artifacts.paths import member_path
from neuronpack.artifacts.verify import quick_check
from neuronpack.errors import ArtifactError
from neuronpack.pipeline.serving import resolve_serving_artifact
from neuronpack.pipeline.verify import verify_artifact


@pytest.fixture
def art(tmp_path, fault_artifact) -> Path:
    dst = tmp_path / "store" / fault_artifact.path.name
    shutil.copytree(fault_artifact.path, dst)
    return dst


def _rename_entry(art: Path, old: str, new: str) -> None:
    manifest = json.loads((art / MANIFEST_NAME).read_text())
    for entry in manifest["files"]:
        if entry["path"] == old:
            entry["path"] = new
    (art / MANIFEST_NAME).write_text(json.dumps(manifest))


def _move_out(art: Path, rel: str, outside: Path) -> Path:
    outside.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(art / rel, outside)
    return outside


def _refused(art: Path, message: str, *, listed: bool = True) -> None:
    with pytest.raises(ArtifactError) as info:
        verify_artifact(art)
    assert message in info.value.what, info.value.what
    assert "\n" not in info.value.one_line() and info.value.fix
    with pytest.raises(ArtifactError, match="manifest file name|symlink"):
        verify_artifact(art, check_hashes=False, check_env=False)
    if listed:  # the cache-hit check stats the listed files only
        assert quick_check(art) is None
    with pytest.raises(ArtifactError, match="manifest file name|symlink"):
        resolve_serving_artifact(art, check_hashes=False)


def test_dotdot_file_name(art, tmp_path):
    # tokenizer.json: a file the torch backend's own required-file check does not look for
    _move_out(art, "tokenizer.json", tmp_path / "store" / "tokenizer.json")
    _rename_entry(art, "tokenizer.json", "../tokenizer.json")
    _refused(art, "manifest file name '../tokenizer.json' has a '..' component")


def test_absolute_file_name(art, tmp_path):
    outside = _move_out(art, "tokenizer.json", tmp_path / "elsewhere" / "tokenizer.json")
    _rename_entry(art, "tokenizer.json", str(outside))
    _refused(art, "is an absolute path")


def test_symlink_to_a_file_outside(art, tmp_path):
    outside = _move_out(art, "config.json", tmp_path / "elsewhere" / "config.json")
    os.symlink(outside, art / "config.json")
    _refused(art, "config.json is a symlink")


def test_symlinked_directory_outside(art, tmp_path):
    outside = _move_out(art, "weights", tmp_path / "elsewhere" / "weights")
    os.symlink(outside, art / "weights")
    _refused(art, "weights is a symlink")


def test_symlink_inside_the_artifact_is_refused_too(art):
    """Our call: any symlink, even to a file of the same artifact (neuronpack never writes one)."""
    (art / "tokenizer_config.json").unlink()
    os.symlink("tokenizer.json", art / "tokenizer_config.json")
    _refused(art, "tokenizer_config.json is a symlink")


def test_unlisted_symlink_is_refused(art):
    os.symlink("/etc/hostname", art / "extra")
    _refused(art, "extra is a symlink", listed=False)


@pytest.mark.parametrize("name", ["", ".", "a//b", "./config.json", "a\\..\\b", "x\x00y", "weights/../../x"])
def test_odd_names(art, name):
    with pytest.raises(ArtifactError, match="manifest file name"):
        member_path(art, name)


def test_verify_command_prints_one_line(art, tmp_path):
    _move_out(art, "config.json", tmp_path / "store" / "config.json")
    _rename_entry(art, "config.json", "../config.json")
    result = subprocess.run([sys.executable, "-m", "neuronpack", "verify", str(art)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "'..' component" in lines[0] and "Traceback" not in result.stderr
