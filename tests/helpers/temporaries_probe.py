"""Tests run by tests/test_temporaries.py in a pytest of their own (not collected by the suite: no test_ prefix), to
see where this suite's temporaries go and when they are removed. PROBE_OUT names a file each test appends what it
saw to; PROBE_FAIL makes one test fail."""

from __future__ import annotations

import json
import os
import tempfile


def _record(**seen) -> None:
    with open(os.environ["PROBE_OUT"], "a") as out:
        out.write(json.dumps(seen) + "\n")


def test_a_passing_test(tmp_path):
    (tmp_path / "made").write_text("x")
    _record(test="passing", tmp_path=str(tmp_path), tempdir=tempfile.gettempdir(), env=os.environ.get("TMPDIR"))


def test_a_module_fixture(module_tmp_path):
    (module_tmp_path / "artifact").mkdir()
    _record(test="module", module_tmp_path=str(module_tmp_path))


def test_a_test_that_may_fail(tmp_path):
    (tmp_path / "evidence").write_text("kept for a look")
    _record(test="may_fail", tmp_path=str(tmp_path))
    assert not os.environ.get("PROBE_FAIL")
