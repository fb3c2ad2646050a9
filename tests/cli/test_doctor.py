"""`neuronpack doctor`: text table and one JSON object; it reports (exit 0) whatever is installed."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from neuronpack.cli.app import app
from tests.backends.neuron_standin import fixtures as standin
from tests.backends.neuron_standin.fixtures import make_placeholder
from tests.helpers.fresh_interpreter import run_fresh

pytestmark = pytest.mark.contract
nxd_sdk, sdk_path = standin.nxd_sdk, standin.sdk_path  # fixtures
ENV = {"COLUMNS": "120"}


def _json(env=None) -> dict:
    result = CliRunner().invoke(app, ["doctor", "--format", "json"], env={**ENV, **(env or {})})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_text_report_without_neuron_sdk(sdk_path):
    result = CliRunner().invoke(app, ["doctor"], env=ENV)
    assert result.exit_code == 0
    out = result.stdout
    assert re.search(r"neuronx-distributed-inference\s+│ missing", out)
    assert re.search(r"auto framework\s+│ torch ", out)
    assert "NOT validated here: not run on hardware: no Neuron compile or load has run" in out


def test_a_refused_framework_variable_reads_refused_not_none(sdk_path):
    result = CliRunner().invoke(app, ["doctor"], env={**ENV, "NEURONPACK_FRAMEWORK": "bogus"})
    assert result.exit_code == 0
    assert re.search(r"with this env\s+│ refused ", result.stdout) and "None" not in result.stdout


def test_json_report_names_placeholder_and_auto_choice(tmp_path, sdk_path):
    sdk_path(make_placeholder(tmp_path, "torch-neuronx", style="pypi"))
    report = _json({"NEURONPACK_FRAMEWORK": "nxd", "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2"})
    packages = {p["dist"]: p for p in report["packages"]}
    assert packages["torch-neuronx"]["state"] == "placeholder"
    assert packages["torch-neuronx"]["version"] == "0.1.0"
    assert "pip.repos.neuron.amazonaws.com" in packages["torch-neuronx"]["reason"]
    assert report["framework"]["auto"] == "torch"
    assert report["framework"]["effective"] == {"name": "nxd", "reason": "NEURONPACK_FRAMEWORK=nxd"}
    assert report["env"] == {"NEURONPACK_FRAMEWORK": "nxd", "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2",
                             "NEURONPACK_CACHE_DIR": report["env"]["NEURONPACK_CACHE_DIR"]}
    assert report["platform"]["platform_target_override"] == "trn2"
    assert report["torch"] and report["python"]["version"]
    assert report["not_validated"]


def test_json_report_with_the_nxd_stand_in(nxd_sdk):
    report = _json()
    packages = {p["dist"]: p for p in report["packages"]}
    assert packages["neuronx-distributed-inference"]["state"] == "ok"
    assert packages["neuronx-distributed-inference"]["version"] == "0.9.17334"
    assert report["neuronx_cc"] == "2.24.5133.0"
    assert report["framework"]["auto"] == "nxd"


def test_bad_env_value_is_reported_not_fatal(sdk_path):
    report = _json({"VLLM_NEURON_FRAMEWORK": "neuron"})
    assert report["framework"]["effective"]["name"] is None
    assert "VLLM_NEURON_FRAMEWORK='neuron'" in report["framework"]["effective"]["reason"]


def test_doctor_does_not_import_torch():
    code = ("from typer.testing import CliRunner; from neuronpack.cli.app import app; "
            "r = CliRunner().invoke(app, ['doctor', '--format', 'json']); print(r.exit_code)")
    out, torch_imported = run_fresh(code)
    assert out == "0" and not torch_imported


def test_at_80_columns_no_item_or_version_is_cut(nxd_sdk):
    """With the stand-in SDK installed (versions in the state column) and a long variable set, at 80 columns."""
    env = {"COLUMNS": "80", "NEURONPACK_ARTIFACTS_ROOT": "/srv/neuronpack/a/deep/artifacts/root/on/a/shared/volume"}
    result = CliRunner().invoke(app, ["doctor"], env=env)
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    table = [line for line in result.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert max(map(len, table)) <= 80
    states = {cells[0]: cells[1] for line in table
              if len(cells := [c.strip() for c in line.split("│")[1:-1]]) == 3 and cells[0]}
    report = _json(env)
    for pkg in report["packages"]:
        # a package importable without its distribution's metadata (a stand-in on sys.path) has no version
        version = f" {pkg['version']}" if pkg["state"] == "ok" and pkg["version"] else ""
        assert states[pkg["dist"]] == pkg["state"] + version
    assert states["python"] == report["python"]["version"] and states["torch"] == report["torch"]
    assert states["$NEURONPACK_ARTIFACTS_ROOT"] == "set"
