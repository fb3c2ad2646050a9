"""`make upstream-check` without UPSTREAM_SRC nor ../shared/upstream: one skip line, exit 0; with a UPSTREAM_SRC
lacking a source tree: exit 1 naming it. Its worker, on upstream NxD Inference 0.9.0 (../shared/upstream or
UPSTREAM_SRC): a recipe's NeuronConfig passes, one with a key NxDI does not know fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.upstream.test_nxdi_cpu import nxdi_setup

ROOT = Path(__file__).parents[1]
TOOL = ROOT / "tools" / "upstream_check.py"
WORKER = ROOT / "tools" / "upstream_check_worker.py"


def test_upstream_check_is_skipped_without_sources(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if k != "UPSTREAM_SRC"}, "UPSTREAM_SHARED": str(tmp_path / "none")}
    out = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0
    assert out.stdout.startswith("upstream-check skipped: UPSTREAM_SRC is not set")


def test_upstream_check_names_missing_sources(tmp_path):
    out = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, check=False,
                         env={**os.environ, "UPSTREAM_SRC": str(tmp_path)})
    assert out.returncode == 1 and "missing in" in out.stderr and "vllm-0.16.0" in out.stderr


def test_worker_fails_a_neuron_config_key_nxdi_does_not_know(tmp_path_factory):
    """NxDI only logs an unknown NeuronConfig kwarg (``logging.warning`` on the root logger) and drops it: the worker
    must see that warning whatever its own logging level, or every NxDI cell passes what NxDI ignores."""
    sources, python, work, llama = nxdi_setup(tmp_path_factory, "worker")
    dry = json.loads(subprocess.run(
        [sys.executable, "-m", "neuronpack", "compile", str(llama), "--recipe", str(ROOT / "recipes" /
         "llama-3.2-1b-inf2.toml"), "--dry-run", "--format", "json", "--out-root", str(work / "root")],
        capture_output=True, text=True, check=True).stdout)
    case = {"model_class": dry["model_class"], "platform_target": dry.get("platform_target"), "model_dir": str(llama),
            "cwd": str(work)}
    unknown = {**dry["neuron_config"], "no_such_key": 1}
    cases = work / "cases.json"
    cases.write_text(json.dumps([{**case, "id": "recipe", "neuron_config": dry["neuron_config"]},
                                 {**case, "id": "unknown", "neuron_config": unknown}]))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work),
           "PYTHONPATH": os.pathsep.join(str(s) for s in sources)}
    out = subprocess.run([str(python), str(WORKER), "nxdi", str(cases)], capture_output=True, text=True, env=env,
                         check=False)
    results = {row["id"]: row["result"] for row in map(json.loads, filter(lambda ln: ln.startswith("{"),
                                                                         out.stdout.splitlines()))}
    assert results["recipe"] == "ok", out.stderr[-2000:]
    assert results["unknown"].startswith("failed: ValueError: NeuronConfig init: Unexpected keyword arguments")
    assert "no_such_key" in results["unknown"]
