import pytest

from tests.convert.eagle_fixtures import tiny_target


@pytest.fixture(scope="session")
def target(tmp_path_factory):
    """tiny EAGLE targets by kind (built once per session): target("llama"), target("tied"), ..."""
    base = tmp_path_factory.getbasetemp() / "eagle-targets"
    return lambda kind: tiny_target(base, kind)
