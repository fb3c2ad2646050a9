"""Fixtures of the backend tests: the vneuron artifacts (tests/backends/vneuron/plugin.py) shared by
test_upstream_cache.py and test_pod.py, built once per session."""

from __future__ import annotations

import pytest

from tests.backends.vneuron.plugin import build_artifacts


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """One vneuron artifact per shipped vneuron recipe, each on a tiny checkpoint of its architecture (the stand-in
    CPU compile with the plugin's 0.21 cache code)."""
    return build_artifacts(tmp_path_factory.mktemp("vneuron"))
