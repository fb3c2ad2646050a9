"""The remote store as a build cache across machines (compile --remote / --push) and as a serving source."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
from typer.testing import CliRunner

from neuronpack.artifacts.store import artifacts_root
from neuronpack.cli.app import app
from neuronpack.pipeline import verify_artifact
from tests.helpers.moto_s3 import free_port
from tests.runtime.serving import EXPORT, RECIPE, SERVE_OVERRIDES, wait_for_health

runner = CliRunner(env={"COLUMNS": "120"})


def cli_json(*args) -> dict:
    result = runner.invoke(app, [*(str(a) for a in args), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def compile_args(model: Path, *extra: str) -> list[str]:
    sets = [arg for o in [*SERVE_OVERRIDES, *EXPORT, *extra] for arg in ("--set", o)]
    return ["compile", str(model), "--recipe", str(RECIPE), *sets]


def test_compile_pushes_then_another_machine_pulls_instead_of_building(s3_store, tiny_llama, tiny_artifact, tmp_path,
                                                                       monkeypatch):
    # CI: the builder's root already holds the artifact (a cache hit); --push publishes it.
    ci = cli_json(*compile_args(tiny_llama), "--out-root", tiny_artifact.parents[1], "--remote", s3_store, "--push")
    assert ci["cache_hit"] and ci["pushed"]["pushed"] and ci["pushed"]["url"] == f"{s3_store}/{ci['key']}"

    # The pod's start script: the key from a dry run on the same inputs, and whether the store has it.
    dry = cli_json(*compile_args(tiny_llama), "--dry-run", "--out-root", tmp_path / "pod", "--remote", s3_store)
    assert dry["key"] == ci["key"] and dry["in_remote"] is True

    # Another machine with NEURONPACK_REMOTE set: a remote hit is pulled, nothing is built.
    monkeypatch.setenv("NEURONPACK_REMOTE", s3_store)
    hit = cli_json(*compile_args(tiny_llama), "--out-root", tmp_path / "other")
    assert hit["remote_hit"] and hit["cache_hit"] and hit["key"] == ci["key"]
    assert "build" not in hit["timings"] and "pull" in hit["timings"] and "remote_lookup" in hit["timings"]
    assert not (tmp_path / "other" / "neuron-compiled-artifacts" / ".failed").exists()
    verify_artifact(Path(hit["path"]))
    local = cli_json(*compile_args(tiny_llama), "--out-root", tmp_path / "other")  # now a plain local hit
    assert local["cache_hit"] and not local["remote_hit"]


def test_compile_builds_on_a_remote_miss_and_pushes(s3_store, tiny_llama, tmp_path):
    result = runner.invoke(app, [*compile_args(tiny_llama, "buckets.context=[16]"), "--out-root", str(tmp_path),
                                 "--remote", s3_store, "--push", "--progress", "plain", "--format", "json"])
    assert result.exit_code == 0, result.output
    built = json.loads(result.stdout)
    # CI logs: one line per stage start and end (not a terminal, so `auto` would print the same)
    assert "remote miss" in result.stderr
    assert re.search(r"compile 3 graphs \(export, \d at a time\): started", result.stderr), result.stderr
    assert f"push {built['key'][:12]}: done in" in result.stderr
    assert not built["cache_hit"] and not built["remote_hit"] and built["pushed"]["pushed"]
    listed = cli_json("ls", "--remote", s3_store)
    assert [a["key"] for a in listed["artifacts"]] == [built["key"]]


def test_push_without_a_remote_is_refused(tiny_llama, tmp_path):
    result = runner.invoke(app, [*compile_args(tiny_llama), "--out-root", str(tmp_path), "--push"])
    assert result.exit_code == 1 and "--push needs a remote store" in result.stderr


def test_serve_print_command_pulls_and_verifies_a_remote_url(s3_store, tiny_artifact, tmp_path, monkeypatch):
    cli_json("push", tiny_artifact, s3_store)
    url = f"{s3_store}/{tiny_artifact.name}"
    shown = cli_json("serve", url, "--root", tmp_path / "pod", "--print-command")
    local = artifacts_root(tmp_path / "pod") / tiny_artifact.name
    assert str(local) in shown["argv"]
    verify_artifact(local)

    monkeypatch.setenv("NEURON_COMPILED_ARTIFACTS", url)
    again = cli_json("serve", "--root", tmp_path / "pod2", "--print-command")
    assert str(artifacts_root(tmp_path / "pod2") / tiny_artifact.name) in again["argv"]

    bad = runner.invoke(app, ["serve", f"{s3_store}/not-a-key", "--print-command"])
    assert bad.exit_code == 1 and "must end with the artifact's 64-character key" in bad.stderr


def test_serve_from_neuron_compiled_artifacts_url_answers_requests(s3_store, tiny_artifact, tmp_path):
    """A pod start: NEURON_COMPILED_ARTIFACTS=s3://.../<key>, `neuronpack serve` pulls, verifies and serves."""
    cli_json("push", tiny_artifact, s3_store)
    port = free_port()
    env = {**os.environ, "NEURON_COMPILED_ARTIFACTS": f"{s3_store}/{tiny_artifact.name}",
           "NEURONPACK_ARTIFACTS_ROOT": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "neuronpack", "serve", "--port", str(port), "--threads", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_health(proc, port)
        name = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"][0]["id"]
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                           json={"model": name, "prompt": "hello", "max_tokens": 3, "temperature": 0}, timeout=60)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    verify_artifact(artifacts_root(tmp_path) / tiny_artifact.name)
