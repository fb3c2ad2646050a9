"""Helpers for the vneuron tests: the pinned vllm-neuron 0.21 sources (../shared/upstream) with the test stand-in
(tests/backends/neuron_standin/vneuron: vLLM's server entry point, the closed version modules, the plugin modules
missing from the partial tree), in a child ``neuronpack`` or in this process."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[3]
# UPSTREAM_SRC's, else ../shared/upstream beside the clone (as tests/upstream/test_nxdi_cpu.py finds NxDI's)
PLUGIN_SRC = Path(os.environ.get("UPSTREAM_SRC") or ROOT.parent / "shared" / "upstream") / "vllm-neuron-0.21" / "src"
STANDIN = ROOT / "tests" / "backends" / "neuron_standin" / "vneuron"
RECIPES = {"llama": ROOT / "recipes" / "llama-3.1-8b-instruct-trn2-vneuron.toml",
           "qwen3": ROOT / "recipes" / "qwen3-8b-trn2-vneuron.toml"}
# the marks of every vneuron test module: contract tests, run wherever the pinned 0.21 sources are (CI has them)
PLUGIN_MARKS = [pytest.mark.contract,
                pytest.mark.skipif(not PLUGIN_SRC.is_dir(), reason=f"{PLUGIN_SRC} (vllm-neuron 0.21 sources) absent")]
PLUGIN_MODULES = ("vllm", "vllm_neuron", "torch_neuronx", "neuronxcc", "nki")
# variables of the plugin a developer's shell could hold; every child starts without them
PLUGIN_ENV = ("VLLM_CACHE_ROOT", "VLLM_NEURON_REMOTE_CACHE", "VLLM_NEURON_ASSERT_CACHE_HIT", "VLLM_NEURON_CPU_COMPILE",
              "VLLM_NEURON_DISABLE_WARMUP_COMPILE", "VLLM_NEURON_DISABLE_COMPILE_CACHE",
              "VLLM_NEURON_DISABLE_GRAPH_CAPTURE_BACKEND", "NEURON_PLATFORM_TARGET_OVERRIDE",
              "NEURON_LOGICAL_NC_CONFIG", "NEURONPACK_STANDIN_FAULT", "NEURON_LIBTORCH_CACHE_ROOT")


def plugin_env(tmp: Path, *, standin: bool = True, **extra: str) -> dict[str, str]:
    """A child's environment: the stand-in + upstream plugin first on PYTHONPATH (``standin``) and the stand-in
    neuronx-cc first on PATH, this checkout's neuronpack, and a private TMPDIR (serve's default local cache root lives
    under it)."""
    env = {k: v for k, v in os.environ.items() if k not in PLUGIN_ENV}
    paths = [str(STANDIN), str(PLUGIN_SRC)] if standin else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
    if standin:
        env["PATH"] = os.pathsep.join([str(STANDIN / "bin"), env.get("PATH", "")])
    env["TMPDIR"] = str(tmp)
    env.update(extra)
    return env


def with_plugin_version(tmp: Path, version: str) -> dict[str, str]:
    """``plugin_env(tmp)`` with the metadata of vllm-neuron ``version`` first on PYTHONPATH (the installed version
    neuronpack reads; the plugin's code stays the stand-in + 0.21 sources)."""
    dist = tmp / f"plugin-{version}" / f"vllm_neuron-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-neuron\nVersion: {version}\n")
    env = plugin_env(tmp)
    env["PYTHONPATH"] = f"{dist.parent}:{env['PYTHONPATH']}"
    return env


def neuronpack(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuronpack", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def compile_artifact(model: Path, recipe: Path, out_root: Path, env: dict[str, str], *sets: str) -> tuple[Path, dict]:
    flags = [x for s in sets for x in ("--set", s)]
    out = neuronpack("compile", str(model), "--recipe", str(recipe), "--out-root", str(out_root), "--format", "json",
                     "--progress", "none", *flags, env=env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    return Path(result["path"]), result


def print_command(artifact: Path, env: dict[str, str], *flags: str) -> dict:
    out = neuronpack("serve", str(artifact), "--print-command", "--format", "json", *flags, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def build_artifacts(base: Path) -> dict[str, dict]:
    """One artifact per shipped vneuron recipe, each on a tiny checkpoint of its architecture."""
    from tests.helpers.tiny_models import make_tiny_checkpoint

    out = {}
    for name, recipe in RECIPES.items():
        model = make_tiny_checkpoint(base / f"model-{name}", arch=name)
        artifact, result = compile_artifact(model, recipe, base / f"root-{name}", plugin_env(base))
        out[name] = {"artifact": artifact, "result": result, "model": model, "tmp": base, "root": base / f"root-{name}"}
    return out


def entries(artifact: Path) -> list[Path]:
    """The packaged graph entries of an artifact."""
    return sorted(p for p in (artifact / "compile_cache").iterdir() if p.is_dir() and p.name != "nki")


def graph_count(manifest: dict) -> int:
    config = manifest["compile_config"]["neuron_config"]
    return len(config["num_batched_tokens_buckets"]) + len(config["num_seqs_buckets"])


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error")]


@contextlib.contextmanager
def upstream_plugin():
    """vllm-neuron 0.21's own ``envs``, ``compile.cache`` and ``nki.nki_cache`` imported in this process (closed /
    missing modules from the stand-in); the environment is read by them lazily, so set it before calling."""
    _purge()
    sys.path[:0] = [str(STANDIN), str(PLUGIN_SRC)]
    try:
        envs = importlib.import_module("vllm_neuron.envs")
        cache = importlib.import_module("vllm_neuron.compile.cache")
        nki_cache = importlib.import_module("vllm_neuron.nki.nki_cache")
        yield SimpleNamespace(envs=envs, cache=cache, nki_cache=nki_cache)
    finally:
        for path in (str(STANDIN), str(PLUGIN_SRC)):
            with contextlib.suppress(ValueError):
                sys.path.remove(path)
        _purge()


def _purge() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in PLUGIN_MODULES:
            del sys.modules[name]
    importlib.invalidate_caches()
