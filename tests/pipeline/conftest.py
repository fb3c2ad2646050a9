import shutil
from pathlib import Path

import pytest

from neuronpack.pipeline import compile_model
from tests.pipeline.builds import FAST, RECIPE


@pytest.fixture(scope="session")
def built_artifact(tmp_path_factory, tiny_llama):
    """One real artifact (tiny llama, export-only graphs), built once; copy it before modifying it."""
    root = tmp_path_factory.mktemp("artifacts")
    result = compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=root)
    return result


@pytest.fixture
def artifact_copy(built_artifact, tmp_path) -> Path:
    dst = tmp_path / "copy" / built_artifact.path.name
    shutil.copytree(built_artifact.path, dst)
    return dst
