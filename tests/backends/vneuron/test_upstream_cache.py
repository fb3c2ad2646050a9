"""The vneuron framework (the SDK 2.31+ vLLM Neuron plugin) held to vllm-neuron 0.21's OWN cache code.

The plugin's CPU compile is stood in (vLLM, the worker and neuronx-cc cannot run here), but every cache entry is
written by upstream's ``CompilationLock`` + ``_store_local`` into the root upstream's resolver gives; what
``neuronpack compile`` packages must pass upstream's ``_is_cache_complete`` / ``_build_cache_artifact``, and what
what the pod's start does is in test_pod.py. Sources: ../shared/upstream/vllm-neuron-0.21 (skipped only
where it is absent; CI has it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.backends.vneuron.plugin import (
    PLUGIN_MARKS,
    RECIPES,
    entries,
    error_lines,
    graph_count,
    neuronpack,
    plugin_env,
    print_command,
    upstream_plugin,
    with_plugin_version,
)

pytestmark = PLUGIN_MARKS
DEBUG_FILES = ("fxgraph.txt", "example_inputs.txt", "command.txt", "log-neuron-cc.txt", ".cache_accessed")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_compile_packages_every_graph_complete_by_upstreams_rule(built, name):
    artifact = built[name]["artifact"]
    manifest = json.loads((artifact / "neuronpack.json").read_text())
    packaged = entries(artifact)
    assert len(packaged) == graph_count(manifest) == manifest["build"]["vneuron"]["entries"]
    with upstream_plugin() as plugin:
        for entry in packaged:
            assert plugin.cache._is_cache_complete(str(entry)), entry
            found = plugin.cache._build_cache_artifact(str(entry), entry.name)  # metadata's cache_key == dir name
            assert found is not None and Path(found.neff_filename).is_file()
    # only what a lookup reads: no locks, lock metadata, access markers or debug files with absolute paths
    files = {p.relative_to(artifact).as_posix() for p in artifact.rglob("*") if p.is_file()}
    assert not [f for f in files if f.endswith(".lock") or ".compilation_metadata" in f
                or f.rsplit("/", 1)[-1] in DEBUG_FILES or "hlo_passes" in f]
    cached = [f for f in files if f.startswith("compile_cache/")]
    assert not [f for f in cached if str(built[name]["tmp"]) in (artifact / f).read_text(errors="replace")]
    listed = {f["path"]: f for f in manifest["files"]}
    assert files - {"neuronpack.json"} == set(listed)
    assert all(len(listed[f]["sha256"]) == 64 for f in listed)
    assert manifest["build"]["vneuron"]["dropped_files"] > 0
    # the NKI kernel's result (upstream's put_nki_cache wrote it, with a lock file beside it)
    assert [f for f in files if f.startswith("compile_cache/nki/")] == [
        f"compile_cache/nki/{p.name}" for p in (artifact / "compile_cache" / "nki").glob("*.json")]
    assert manifest["build"]["vneuron"]["nki"] == 1
    env = plugin_env(built[name]["tmp"])
    assert neuronpack("verify", str(artifact), env=env).returncode == 0


def test_the_key_holds_the_stack_versions_target_and_lnc(built):
    manifest = json.loads((built["llama"]["artifact"] / "neuronpack.json").read_text())
    versions = manifest["key_inputs"]["versions"]
    assert versions["vllm-neuron"] == "0.21.0.1.0.0" and versions["vllm"] == "0.21.0"
    assert {"neuronx-cc", "torch-neuronx", "libtorch-neuronx-lite", "nki"} <= set(versions)
    assert manifest["key_inputs"]["target"] == {"instance": "trn2", "platform_target": "trn2", "lnc": 2}
    assert manifest["key_inputs"]["model"]["weights"]["files"]  # the weights by content


def test_a_missing_packaged_entry_is_one_line_before_vllm_starts(built, tmp_path):
    copy = tmp_path / built["llama"]["artifact"].name
    shutil.copytree(built["llama"]["artifact"], copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    shutil.rmtree(entries(copy)[0])
    out = neuronpack("serve", str(copy), "--port", "1", env=plugin_env(tmp_path))
    assert out.returncode == 1
    assert len(error_lines(out.stderr)) == 1 and "Traceback" not in out.stderr
    assert "compile_cache/" in error_lines(out.stderr)[0]


def test_a_different_plugin_version_is_one_line_before_vllm_starts(built, tmp_path):
    env = with_plugin_version(tmp_path, "0.21.0.1.0.1")
    out = neuronpack("serve", str(built["llama"]["artifact"]), "--print-command", env=env)
    assert out.returncode == 1
    [line] = error_lines(out.stderr)
    assert "built with vllm-neuron 0.21.0.1.0.0, this machine has 0.21.0.1.0.1" in line


@pytest.mark.parametrize(("fault", "sets", "message"), [
    ("incomplete", (), "cannot be packaged: it has no .compilation_complete"),
    ("metadata-v1", (), "cannot be packaged: it has no readable .artifact_metadata_v0.json, the only metadata the "
                        "plugin's loader reads (found .artifact_metadata_v1.json)"),
    ("exit", (), "exited with code 70 before it served (neuronx-cc compilation failed with -9"),
    ("hang", ("vneuron.compile_timeout=10",), "did not finish within 10 s"),
])
def test_a_failed_cpu_compile_is_one_line_and_publishes_nothing(built, tmp_path, fault, sets, message):
    model = built["llama"]["model"]
    env = plugin_env(tmp_path, NEURONPACK_STANDIN_FAULT=fault)
    flags = [x for s in sets for x in ("--set", s)]
    out = neuronpack("compile", str(model), "--recipe", str(RECIPES["llama"]), "--out-root", str(tmp_path / "root"),
                     "--progress", "none", *flags, env=env)
    assert out.returncode == 1, out.stderr
    [line] = error_lines(out.stderr)
    assert message in line and "Traceback" not in out.stderr
    store = tmp_path / "root" / "neuron-compiled-artifacts"
    assert not [p for p in store.iterdir() if not p.name.startswith(".")]  # nothing published
    assert not [p for p in (store / ".staging").iterdir() if p.is_dir()]  # no half-built artifact left
    assert not _processes_with(str(tmp_path / "root"))  # the (hung) compile's whole process group was stopped


@pytest.mark.parametrize("versions", [(0,), (1,), (0, 1), (2, 0)])
def test_neuronpacks_entry_rule_is_upstreams_loader(tmp_path, versions, monkeypatch):
    """An entry passes neuronpack's rule exactly when 0.21's own loader (``_build_cache_artifact``) loads it. With
    only ``.artifact_metadata_v1.json`` upstream's ``_is_cache_complete`` still says complete, and the pod's start
    failed with "Required artifact metadata missing from cache" after `verify` had passed."""
    from neuronpack.backends.vneuron.cache import entry_problem, metadata_versions

    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with upstream_plugin() as plugin:
        from vllm_neuron.compile.artifacts import CompilationArtifacts
        from vllm_neuron.compile.schema import create_metadata

        key = "0123456789abcdef0123456789abcdef"
        entry = tmp_path / key
        entry.mkdir()
        (entry / "graph.hlo").write_bytes(b"hlo")
        neff = entry / plugin.cache.get_neff_filename(str(entry))
        neff.write_bytes(b"neff")
        for version in versions:  # each through upstream's own writer (the file name comes from the version)
            plugin.cache.save_artifact_metadata(str(entry), create_metadata(cache_key=key, version=version))
        plugin.cache._store_local(key, CompilationArtifacts(str(entry / "graph.hlo"), str(neff),
                                                            create_metadata(cache_key=key, version=versions[0])),
                                  str(tmp_path))
        assert plugin.cache._is_cache_complete(str(entry))  # any version: complete for upstream
        try:
            plugin.cache._build_cache_artifact(str(entry), key)
            loads = True
        except RuntimeError as exc:
            assert "Required artifact metadata missing from cache" in str(exc)
            loads = False
    assert (entry_problem(entry, metadata_versions("0.21.0.1.0.0")) is None) == loads == (0 in versions)


def test_compile_without_the_plugin_is_one_line(tmp_path, built):
    out = neuronpack("compile", str(built["llama"]["model"]), "--recipe", str(RECIPES["llama"]), "--out-root",
                     str(tmp_path), env=plugin_env(tmp_path, standin=False))
    assert out.returncode == 1
    [line] = error_lines(out.stderr)
    assert "framework vneuron cannot build here: vllm-neuron is not installed" in line


# --- helpers ---------------------------------------------------------------------------------------------------------
def _processes_with(text: str) -> list[str]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []) or text in str(proc.info["environ"] or ""):
                found.append(str(proc.info["cmdline"]))
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
    return found


@pytest.mark.parametrize("flags", [("--vllm-target", "vllm-neuron"), ("--no-enable-prefix-caching",),
                                   ("--max-prefill-tokens", "64")])
def test_the_built_in_runtimes_options_and_other_targets_are_refused_for_a_vneuron_artifact(built, tmp_path, flags):
    out = neuronpack("serve", str(built["llama"]["artifact"]), "--print-command", *flags, env=plugin_env(tmp_path))
    assert out.returncode == 1
    [line] = error_lines(out.stderr)
    assert flags[0] in line or "served by vLLM" in line


def test_a_tool_call_parser_is_passed_to_the_plugins_vllm(built, tmp_path):
    argv = print_command(built["llama"]["artifact"], plugin_env(tmp_path), "--tool-call-parser", "hermes")["argv"]
    assert argv[-3:] == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
