"""`make upstream-check` without UPSTREAM_SRC nor ../shared/upstream: one skip line, exit 0; with a UPSTREAM_SRC
lacking a source tree: exit 1 naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).parents[1] / "tools" / "upstream_check.py"


def test_upstream_check_is_skipped_without_sources(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if k != "UPSTREAM_SRC"}, "UPSTREAM_SHARED": str(tmp_path / "none")}
    out = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0
    assert out.stdout.startswith("upstream-check skipped: UPSTREAM_SRC is not set")


def test_upstream_check_names_missing_sources(tmp_path):
    out = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, check=False,
                         env={**os.environ, "UPSTREAM_SRC": str(tmp_path)})
    assert out.returncode == 1 and "missing in" in out.stderr and "vllm-0.16.0" in out.stderr
