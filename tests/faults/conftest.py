import pytest

from neuronpack.pipeline import compile_model
from tests.pipeline.builds import FAST, RECIPE


@pytest.fixture(scope="session")
def fault_artifact(tmp_path_factory, tiny_llama):
    """One real artifact (tiny llama, export-only graphs) for the fault tests; copy it before changing it."""
    root = tmp_path_factory.mktemp("fault-artifacts")
    return compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=root)
