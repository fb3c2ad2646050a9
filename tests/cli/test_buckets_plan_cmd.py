"""`neuronpack buckets plan` end to end through the CLI: the table and --set lines, --format json, --write (atomic,
only the named recipe changes), and bad input as one line with exit 1; `buckets --seq-len` unchanged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NP = [sys.executable, "-m", "neuronpack"]
TRAFFIC = ROOT / "bench" / "traces" / "shared-prefix.jsonl"


def np(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*NP, *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture
def recipe(tmp_path) -> Path:
    path = tmp_path / "mine.toml"
    shutil.copy(ROOT / "recipes" / "llama-3.1-8b-instruct-trn1.toml", path)
    return path


def test_plan_prints_both_plans_and_set_lines(recipe):
    done = np("buckets", "plan", "--traffic", str(TRAFFIC), "--recipe", str(recipe))
    assert done.returncode == 0, done.stderr
    assert "current" in done.stdout and "planned" in done.stdout
    assert "--set buckets.context=[" in done.stdout and "--set buckets.token_generation=[" in done.stdout


def test_plan_json_and_write_change_only_the_recipe(recipe, tmp_path):
    traffic = tmp_path / "log.jsonl"
    shutil.copy(TRAFFIC, traffic)
    before = traffic.read_bytes()
    recipe.chmod(0o640)
    done = np("buckets", "plan", "--traffic", str(traffic), "--recipe", str(recipe), "--max-graphs", "6", "--write",
              "--format", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["planned"]["graphs"] <= 6 and result["written"] == str(recipe.resolve())
    text = recipe.read_text()
    assert f"context = {json.dumps(result['planned']['context'])}" in text
    assert "# Llama-3.1-8B-Instruct on trn1.32xlarge" in text  # comments kept
    assert traffic.read_bytes() == before and oct(recipe.stat().st_mode & 0o777) == "0o640"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "mine.toml"]  # no temporary file left


def test_vneuron_plan_writes_a_plugin_config(tmp_path):
    recipe = tmp_path / "v.toml"
    shutil.copy(ROOT / "recipes" / "llama-3.1-8b-instruct-trn2-vneuron.toml", recipe)
    done = np("buckets", "plan", "--traffic", str(TRAFFIC), "--recipe", str(recipe), "--write", "--format", "json")
    assert done.returncode == 0, done.stderr
    from neuronpack.backends.vneuron.config import plugin_config
    from neuronpack.recipe import load_recipe

    neuron = plugin_config(load_recipe(recipe), {}).neuron_config
    planned = json.loads(done.stdout)["planned"]
    assert neuron["num_batched_tokens_buckets"] == planned["context"]
    assert neuron["decode_context_length_buckets"] == planned["token_generation"]
    assert neuron["num_seqs_buckets"] == planned["batch"]


@pytest.mark.parametrize(("args", "message"), [
    (["--max-graphs", "1"], "a budget of 1 graphs fits no plan: nxd needs at least 2"),
    (["--compile-budget", "100", "--root", "/nonexistent"], "--compile-budget needs the seconds one graph takes"),
    (["--framework", "cuda"], "cannot plan buckets for framework 'cuda'"),
    (["--set", "target.seq_len=256", "--set", "target.max_context_length=256"], "past the model's maximum prompt"),
    (["--compile-budget", "inf", "--graph-seconds", "300"], "--compile-budget inf is not a finite number"),
    (["--compile-budget", "nan", "--graph-seconds", "300"], "--compile-budget nan is not a finite number"),
    (["--compile-budget", "100", "--graph-seconds", "nan"], "--graph-seconds nan is not a finite number"),
    (["--compile-budget", "1e308", "--graph-seconds", "0.001"], "is more graphs than a budget can count"),
    (["--kv-weight", "nan"], "--kv-weight nan is not a finite number"),
    (["--kv-weight", "0"], "--kv-weight 0 must be above zero"),
])
def test_bad_input_is_one_line(recipe, args, message):
    before = recipe.read_text()
    done = np("buckets", "plan", "--traffic", str(TRAFFIC), "--recipe", str(recipe), *args)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and recipe.read_text() == before


def test_empty_log_and_write_without_recipe(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    done = np("buckets", "plan", "--traffic", str(empty), "--framework", "nxd")
    assert done.returncode == 1 and "holds no requests" in done.stderr
    done = np("buckets", "plan", "--traffic", str(TRAFFIC), "--framework", "nxd", "--write")
    assert done.returncode == 1 and "--write needs the recipe" in done.stderr


def test_buckets_seq_len_form_still_works():
    done = np("buckets", "--seq-len", "1024", "--max-context-length", "512", "--context", "128,512", "--format", "json")
    assert json.loads(done.stdout)["context"] == [128, 512]
    missing = np("buckets")
    assert missing.returncode == 2 and "Missing option '--seq-len'" in missing.stderr
