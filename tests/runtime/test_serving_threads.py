"""``neuronpack serve``'s default compute threads leave one core to the HTTP server (runtime/loader.py), and the
server says how many it runs."""

from __future__ import annotations

import os

import pytest

from neuronpack.runtime import loader


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (8, 7)])
def test_serving_threads_leave_one_core_to_the_http_server(monkeypatch, cores, threads):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert loader.available_cores() == cores
    assert loader.serving_threads() == threads
