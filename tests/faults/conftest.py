from pathlib import Path

import pytest

from neuronpack.pipeline import compile_model

RECIPE = Path(__file__).parents[2] / "recipes" / "tiny-test.toml"


@pytest.fixture(scope="session")
def fault_artifact(tmp_path_factory, tiny_llama):
    """One real artifact (tiny llama, export-only graphs) for the fault tests; copy it before changing it."""
    root = tmp_path_factory.mktemp("fault-artifacts")
    return compile_model(str(tiny_llama), recipe=RECIPE, overrides=["compiler=export"], out_root=root)
