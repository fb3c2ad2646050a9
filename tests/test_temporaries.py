"""The suite's temporaries (tests/conftest.py, pyproject.toml's tmp_path_retention_*): under the checkout's build tree
(NEURONPACK_TEST_TMPDIR here, to keep off this run's own), a passed test's tmp_path and a module's directory removed
as they end, nothing left after a green run; a failed run keeps its failed test's directory (and the module
directory of its file), and only those. Run on tests/helpers/temporaries_probe.py in a pytest of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_probe(where: Path, out: Path, **env: str) -> tuple[int, dict]:
    out.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "helpers" / "temporaries_probe.py")], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "NEURONPACK_TEST_TMPDIR": str(where), "PROBE_OUT": str(out),
                                          **env})
    seen = {r["test"]: r for r in map(json.loads, out.read_text().splitlines())}
    return done.returncode, seen


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def test_temporaries_stay_under_the_build_tree_and_a_green_run_leaves_none(tmp_path):
    where = tmp_path / "build-test-tmp"
    code, seen = run_probe(where, tmp_path / "seen.jsonl")
    assert code == 0
    assert seen["passing"]["tempdir"] == seen["passing"]["env"] == str(where)  # children inherit it too
    assert Path(seen["passing"]["tmp_path"]).is_relative_to(where)  # pytest's own: where/pytest-of-<user>/pytest-N
    assert files_under(where) == []  # the green run removed everything it made


def test_a_failed_run_keeps_only_its_failed_tests_directory(tmp_path):
    where = tmp_path / "build-test-tmp"
    code, seen = run_probe(where, tmp_path / "seen.jsonl", PROBE_FAIL="1")
    assert code == 1
    kept = [p for p in files_under(where) if "pytest-current" not in p]
    failed = Path(seen["may_fail"]["tmp_path"])
    assert [str(where / p) for p in kept] == [str(failed / "evidence")]
    assert not Path(seen["passing"]["tmp_path"]).exists()
    assert Path(seen["module"]["module_tmp_path"]).is_dir()  # its file had a failure: kept with it
