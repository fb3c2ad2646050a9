"""The pod's start of a vneuron artifact (backends/vneuron/pod.py, launch.py), held to vllm-neuron 0.21's OWN code.

What a device start of 0.21 does is read from its source (../shared/upstream/vllm-neuron-0.21): the worker captures
every graph that is not a LOCAL hit and upstream's ``parallel_compile`` compiles each, whatever the remote cache and
``VLLM_NEURON_ASSERT_CACHE_HIT`` say; then ``compile()`` looks each graph up. The stand-in server runs that order
with upstream's cache, parallel-compile and backend modules (a stand-in neuronx-cc on PATH), and the tests below call
upstream's ``compile()`` itself. Before this design the pod's local root started empty with the artifact as the
plugin's remote cache: upstream's start then compiled every graph (8 of 8 here) without an error.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from neuronpack.backends.vneuron.backend import plugin_cache_root
from neuronpack.backends.vneuron.cache import fill_local_root
from neuronpack.fsutil import remove_tree
from tests.backends.vneuron.plugin import (
    PLUGIN_MARKS,
    PLUGIN_SRC,
    entries,
    error_lines,
    neuronpack,
    plugin_env,
    print_command,
    upstream_plugin,
)
from tests.backends.vneuron.plugin import ROOT as REPO

pytestmark = PLUGIN_MARKS
GUARDS = {"VLLM_NEURON_DISABLE_WARMUP_COMPILE": "1", "VLLM_NEURON_DISABLE_GRAPH_CAPTURE_BACKEND": "1",
          "NEURON_LIBTORCH_DISABLE_GRAPH_CAPTURE_BACKEND": "1", "VLLM_NEURON_DISABLE_COMPILE_CACHE": "0",
          "NEURON_LIBTORCH_DISABLE_COMPILE_CACHE": "0", "VLLM_NEURON_CPU_COMPILE": "0"}


def test_the_pods_environment_and_command(built, tmp_path):
    artifact = built["llama"]["artifact"]
    cmd = print_command(artifact, plugin_env(tmp_path))
    env = cmd["env"]
    assert {k: env[k] for k in GUARDS} == GUARDS
    assert Path(env["VLLM_CACHE_ROOT"]).is_relative_to(tmp_path)  # TMPDIR
    # nothing unconfirmed and no remote cache: every graph is local
    unset = {"NEURON_LIBTORCH_ASSERT_CACHE_HIT", "VLLM_NEURON_REMOTE_CACHE", "NEURON_LIBTORCH_REMOTE_CACHE"}
    assert not unset & set(env)
    argv = cmd["argv"]
    assert argv[1:5] == ["-m", "neuronpack.backends.vneuron.pod", str(artifact), "--"]
    assert argv[6:8] == ["-m", "vllm.entrypoints.openai.api_server"]
    logged = print_command(artifact, plugin_env(tmp_path), "--request-log", "requests.jsonl")  # vLLM writes none:
    assert "--request-log" not in logged["argv"] and "--enable-log-requests" in logged["notes"][-1]  # where instead


def test_every_packaged_graph_is_a_local_hit_for_upstreams_compile(built, tmp_path, monkeypatch):
    """The pod's environment + the filled root: upstream's own ``compile()`` (backend.py 0.21) finds every graph
    locally, and the NKI result too, and never compiles."""
    artifact = built["llama"]["artifact"]
    cmd = print_command(artifact, plugin_env(tmp_path))
    for name, value in cmd["env"].items():
        monkeypatch.setenv(name, value)
    root = plugin_cache_root(Path(cmd["env"]["VLLM_CACHE_ROOT"]))
    packaged = sorted(entry.name for entry in entries(artifact))
    assert sorted(fill_local_root(artifact / "compile_cache", root)) == packaged
    with upstream_plugin() as plugin:
        assert plugin.envs.get_neuron_compile_cache_dir() == str(root)  # upstream's resolver: the filled root
        found = _upstream_compile(plugin, cmd["argv"], monkeypatch)
        assert sorted(found) == packaged
        for key, neff in found.items():
            assert neff == root / key / f"graph_{key}.neff"
            assert (root / key / ".cache_accessed").is_file()  # upstream's get_local marked the hit
        for result in (artifact / "compile_cache" / "nki").glob("*.json"):
            assert plugin.nki_cache.get_nki_cache(result.stem) is not None  # a local NKI hit
    assert neuronpack("verify", str(artifact), env=plugin_env(tmp_path)).returncode == 0  # the artifact untouched


def test_a_graph_the_artifact_lacks_is_an_error_in_upstreams_compile(built, tmp_path, monkeypatch):
    artifact = built["llama"]["artifact"]
    cmd = print_command(artifact, plugin_env(tmp_path))
    for name, value in cmd["env"].items():
        monkeypatch.setenv(name, value)
    root = plugin_cache_root(Path(cmd["env"]["VLLM_CACHE_ROOT"]))
    fill_local_root(artifact / "compile_cache", root)
    missing = sorted(root.iterdir())[0].name
    shutil.rmtree(root / missing)
    with upstream_plugin() as plugin, pytest.raises(
            RuntimeError, match=f"VLLM_NEURON_DISABLE_WARMUP_COMPILE: local compile cache miss for key {missing}"):
        _upstream_compile(plugin, cmd["argv"], monkeypatch)


def test_serve_starts_with_every_graph_a_local_hit_from_a_fresh_root_each_time(built, tmp_path):
    """End to end through `neuronpack serve`: the stand-in server's device start (capture + upstream's
    parallel_compile, then the lookups) compiles nothing, and a NEFF altered in the local root between two starts is
    not what the second start loads."""
    artifact = built["llama"]["artifact"]
    env = plugin_env(tmp_path)
    packaged = {entry.name: _sha256(entry / f"graph_{entry.name}.neff") for entry in entries(artifact)}
    stats, output = _serve(artifact, env)
    assert stats == {"local_hits": len(packaged), "fetched": 0, "compiled": 0, "nki_compiled": 0, "nki_hits": 1,
                     "loaded": packaged}
    assert f"vLLM serves: {len(packaged)} of {len(packaged)} packaged graphs were local hits, none compiled" in output
    assert ("in force for the installed plugin (its envs modules read them): VLLM_NEURON_DISABLE_WARMUP_COMPILE, "
            "VLLM_NEURON_DISABLE_GRAPH_CAPTURE_BACKEND") in output
    root = plugin_cache_root(Path(print_command(artifact, env)["env"]["VLLM_CACHE_ROOT"]))
    key = sorted(packaged)[0]
    (root / key / f"graph_{key}.neff").write_bytes(b"altered on the pod")
    stats, _ = _serve(artifact, env)
    assert stats["loaded"] == packaged and stats["compiled"] == 0  # the altered NEFF was replaced, not served


def test_a_graph_the_artifact_lacks_stops_the_start(built, tmp_path):
    env = plugin_env(tmp_path, NEURONPACK_STANDIN_FAULT="new-graph")
    out = _serve(built["llama"]["artifact"], env, expect_exit=True)
    assert "VLLM_NEURON_DISABLE_WARMUP_COMPILE: local compile cache miss for key" in out
    assert "vLLM exited with code 1 before it served" in out


def test_a_compile_that_no_guard_stopped_is_caught_and_the_server_stopped(built, tmp_path):
    """A plugin for which the guard variables do nothing (the stand-in's ``ignore-guards``) compiles a graph the
    artifact lacks at start: the pod sees the new entry in its local root, stops vLLM and exits 1 with one line."""
    env = plugin_env(tmp_path, NEURONPACK_STANDIN_FAULT="new-graph,ignore-guards")
    out = _serve(built["llama"]["artifact"], env, expect_exit=True)
    [line] = error_lines(out)
    assert "the plugin started compiling graph" in line and "which the artifact does not hold" in line
    assert "Traceback" not in out


def test_a_plugin_that_resolves_another_root_is_refused_before_vllm_starts(built, tmp_path):
    """A cache library that honours NEURON_LIBTORCH_CACHE_ROOT before VLLM_CACHE_ROOT (what a third-party README says
    of 0.24's libtorch_neuronx_lite.envs; written here by the test, not a copy of it) with that variable set."""
    lite = tmp_path / "lite" / "libtorch_neuronx_lite"
    lite.mkdir(parents=True)
    (lite / "__init__.py").write_text("")
    (lite / "envs.py").write_text(
        "import os\n\n\ndef get_neuron_compile_cache_dir():\n"
        "    root = os.environ.get('NEURON_LIBTORCH_CACHE_ROOT')\n"
        "    return root or os.path.join(os.environ['VLLM_CACHE_ROOT'], 'neuron/compile_cache')\n")
    env = plugin_env(tmp_path, NEURON_LIBTORCH_CACHE_ROOT=str(tmp_path / "elsewhere"))
    env["PYTHONPATH"] = f"{lite.parent}:{env['PYTHONPATH']}"
    out = _serve(built["llama"]["artifact"], env, expect_exit=True)
    [line] = error_lines(out)
    assert f"libtorch_neuronx_lite.envs resolves its compile cache to {tmp_path / 'elsewhere'}" in line
    assert "unset NEURON_LIBTORCH_CACHE_ROOT" in line and "stand-in vLLM serving" not in out


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs util-linux setpriv")
@pytest.mark.parametrize("copy", ["built", "pulled"])
def test_an_unprivileged_pod_serves_a_built_or_a_pulled_artifact(built, tmp_path, copy):
    """Both are read-only (artifacts/modes.py); the pod's local root is its own, so the plugin marks its hits there and
    a restart replaces it. Root without capabilities (setpriv) obeys the permission bits as any user does."""
    artifact = built["llama"]["artifact"]
    env = plugin_env(tmp_path)
    if copy == "pulled":
        store = f"file://{tmp_path / 'store'}"
        assert neuronpack("push", str(artifact), store, "--progress", "none", env=env).returncode == 0
        pulled = neuronpack("pull", artifact.name, "--from", store, "--root", str(tmp_path / "pod"), "--progress",
                            "none", env=env)
        assert pulled.returncode == 0, pulled.stderr
        artifact = tmp_path / "pod" / "neuron-compiled-artifacts" / artifact.name
    assert {stat.S_IMODE(p.stat().st_mode) for p in artifact.rglob("*") if p.is_file()} == {0o444}
    unprivileged = ["setpriv", "--inh-caps=-all", "--bounding-set=-all"]
    for _start in range(2):
        stats, output = _serve(artifact, env, prefix=unprivileged)
        graphs = len(entries(artifact))
        assert (stats["local_hits"], stats["compiled"]) == (graphs, 0)
        assert f"{graphs} of {graphs} packaged graphs were local hits" in output  # .cache_accessed written


NOBODY = 65534  # an unprivileged uid that exists on every Linux (no user is created)


@pytest.fixture
def other_user(built):
    """(a command prefix that runs as an unprivileged user, a directory that user can read, in which the test puts
    what the pod reads, and its uid): as root, setpriv to uid 65534 with no groups and no capability but, where the
    Python it runs lives in a directory other users cannot search (a pyenv under /root), CAP_DAC_READ_SEARCH, which
    lets it read and search, never write; as anyone else, that user itself. The directory lies outside pytest's 0700
    temporaries, under the same temporary root."""
    shared = Path(tempfile.mkdtemp(prefix="unprivileged-pod-"))
    shared.chmod(0o755)
    reads = (shared, REPO, PLUGIN_SRC)  # what the pod reads: the test's files, this checkout, the plugin
    blocked = [p for path in reads for p in (path, *path.parents) if p.is_dir() and not p.stat().st_mode & 0o001]
    if os.geteuid() != 0:
        prefix, uid = [], os.geteuid()
    elif not shutil.which("setpriv") or blocked:
        shutil.rmtree(shared)
        pytest.skip(f"{blocked[0]} is not searchable by other users" if blocked else
                    "running as root without util-linux setpriv: no way to start the pod as another user")
    else:
        interpreter = Path(sys.executable).resolve()
        hidden = any(not p.stat().st_mode & 0o001 for p in interpreter.parents)
        caps = (["--inh-caps=-all,+dac_read_search", "--ambient-caps=+dac_read_search"] if hidden
                else ["--inh-caps=-all"])
        prefix, uid = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *caps, "--"], NOBODY
    yield prefix, shared, uid
    remove_tree(shared)


def test_a_second_start_as_an_unprivileged_user_leaves_nothing_behind_and_gc_cleans_it(built, other_user):
    """The pod's writable directory ($TMPDIR/neuronpack-vllm/<key>) belongs to the user the pod runs as: a second
    start replaces the first start's local cache root (entries this user owns, the plugin's .cache_accessed in them)
    and leaves neither the old root nor a staging copy; `neuronpack gc` keeps the directory while its artifact
    exists and removes it once the artifact is gone."""
    prefix, shared, uid = other_user
    artifact = shared / "root" / "neuron-compiled-artifacts" / built["llama"]["artifact"].name
    shutil.copytree(built["llama"]["artifact"], artifact)  # modes kept: 0555 directories, 0444 files
    weights = Path(shutil.copytree(built["llama"]["model"], shared / "model"))  # what vLLM loads, readable too
    for path in weights.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    home = shared / "home"
    home.mkdir()
    os.chown(home, uid, -1)
    env = {**plugin_env(home), "HOME": str(home), "NEURONPACK_CACHE_DIR": str(home / "np-cache")}
    graphs = len(entries(artifact))
    for _start in range(2):
        stats, output = _serve(artifact, env, prefix=prefix, args=("--weights", str(weights)))
        assert (stats["local_hits"], stats["compiled"]) == (graphs, 0), output
    base = home / "neuronpack-vllm" / artifact.name
    left = sorted(str(p.relative_to(base)) for p in base.rglob("*") if "compile_cache/" not in str(p.relative_to(base)))
    assert left == [".neuronpack-pod.json", ".neuronpack-pod.lock", "neuron", "neuron/.compile_cache.lock",
                    "neuron/compile_cache"]  # no earlier root, no staging copy
    assert sorted(p.name for p in (base / "neuron" / "compile_cache").iterdir()) == sorted(
        p.name for p in (artifact / "compile_cache").iterdir())
    assert {p.stat().st_uid for p in base.rglob("*")} == {uid}

    gc = [*prefix, sys.executable, "-m", "neuronpack", "gc", "--root", str(shared / "root"), "--format", "json"]
    kept = json.loads(subprocess.run(gc, env=env, capture_output=True, text=True, check=True).stdout)
    assert kept["removed"] == [] and base.is_dir()  # its artifact is still there
    remove_tree(artifact.parent)
    removed = json.loads(subprocess.run(gc, env=env, capture_output=True, text=True, check=True).stdout)
    assert [(r["kind"], r["path"]) for r in removed["removed"]] == [("pod-cache", str(base))]
    assert "is gone, and no pod uses it" in removed["removed"][0]["reason"]
    assert sorted(p.name for p in (home / "neuronpack-vllm").iterdir()) == []


def test_push_to_s3_then_serve_by_url_starts_with_every_graph_from_the_artifact(built, tmp_path, monkeypatch):
    """The S3 store is what the plugin lacks: CI pushes once, a pod serves s3://.../<key> (pulled, verified)."""
    from tests.artifacts.conftest import use_s3
    from tests.helpers.moto_s3 import MotoServer

    artifact = built["qwen3"]["artifact"]
    with MotoServer() as server:
        store = use_s3(server, monkeypatch)
        env = plugin_env(tmp_path)
        pushed = neuronpack("push", str(artifact), store, "--progress", "none", env=env)
        assert pushed.returncode == 0, pushed.stderr
        stats, _ = _serve(f"{store}/{artifact.name}", {**env, "NEURONPACK_ARTIFACTS_ROOT": str(tmp_path / "pod")})
    assert (stats["local_hits"], stats["fetched"], stats["compiled"]) == (len(entries(artifact)), 0, 0)
    pulled = tmp_path / "pod" / "neuron-compiled-artifacts" / artifact.name
    assert sorted(p.name for p in entries(pulled)) == sorted(p.name for p in entries(artifact))


# --- helpers ---------------------------------------------------------------------------------------------------------
def _upstream_compile(plugin, argv: list[str], monkeypatch) -> dict[str, Path]:
    """Every graph of the stand-in server's start through upstream's ``compile()`` (backend.py 0.21): {key: NEFF}.
    Meta tensors stand in for neuron ones (``preprocess_and_validate_inputs`` wants a Neuron device), the
    executable is the artifacts found, and a compile fails the test."""
    backend = importlib.import_module("vllm_neuron.compile.backend")
    server = importlib.import_module("vllm.entrypoints.openai.api_server")
    monkeypatch.setattr(backend, "preprocess_and_validate_inputs", lambda gm, inputs: (gm, inputs))
    monkeypatch.setattr(backend, "build_executable", lambda **kw: kw["artifacts"])
    monkeypatch.setattr(backend, "execute_compile", lambda *a: pytest.fail("upstream compiled a graph at start"))
    args = server.parse_args(argv[argv.index("--") + 4:])
    found = {}
    for _name, gm, inputs in server.graphs(args):
        neff = Path(backend.compile(gm, inputs, server.compiler_options()).neff_filename)
        found[neff.parent.name] = neff
    return found


def test_a_fine_tune_takes_every_cache_entry_without_a_cpu_compile(built, tmp_path):
    """A new checkpoint of the same model: the plugin's entries are keyed on graphs (create_cache_hash: FX graph,
    shapes, compiler), so they carry over as they are; no CPU compile runs, upstream's loader takes every entry, and
    the pod's start (upstream's capture + parallel_compile, then its lookups) compiles nothing while vLLM loads the
    NEW weights."""
    from tests.backends.vneuron.plugin import RECIPES, compile_artifact
    from tests.helpers.tiny_models import fine_tune_copy

    donor = built["llama"]
    tuned = fine_tune_copy(donor["model"], tmp_path / "fine-tune")
    artifact, result = compile_artifact(tuned, RECIPES["llama"], donor["root"], plugin_env(donor["tmp"]))
    assert result["key"] != donor["result"]["key"] and result["graphs_from"]["key"] == donor["result"]["key"]
    manifest = (artifact / "neuronpack.json").read_text()
    assert '"compile_seconds"' not in manifest  # the plugin's CPU compile never started
    mine = entries(artifact)
    assert [e.name for e in mine] == [e.name for e in entries(donor["artifact"])]
    with upstream_plugin() as plugin:
        for entry in mine:
            assert plugin.cache._build_cache_artifact(str(entry), entry.name) is not None
    env = plugin_env(tmp_path)
    packaged = {entry.name: _sha256(entry / f"graph_{entry.name}.neff") for entry in mine}
    stats, _ = _serve(artifact, env)
    assert stats == {"local_hits": len(packaged), "fetched": 0, "compiled": 0, "nki_compiled": 0, "nki_hits": 1,
                     "loaded": packaged}
    argv = print_command(artifact, env)["argv"]
    assert argv[argv.index("--model") + 1] == str(tuned)  # vLLM reads the fine-tune's weights

def _serve(artifact: Path | str, env: dict[str, str], *, expect_exit: bool = False, prefix: list[str] = (),
           args: tuple[str, ...] = ()):
    """`neuronpack serve` on a free port: (the stand-in's /stats, the output) once it answers and was stopped with
    SIGTERM, or the output of a start that exits 1 (``expect_exit``). Either way no vLLM is left running."""
    port = _free_port()
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "neuronpack", "serve", str(artifact), "--port", str(port),
                             *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True)
    try:
        if expect_exit:
            output = proc.communicate(timeout=90)[0]
            assert proc.returncode == 1, output
            return output
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            try:
                stats = httpx.get(f"http://127.0.0.1:{port}/stats", timeout=2).json()
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            time.sleep(2 * 0.5)  # the pod's watcher reports once it has seen /health
            proc.terminate()
            output = proc.communicate(timeout=60)[0]
            assert proc.returncode == 128 + 15, output  # vLLM's status, passed on
            return stats, output
        pytest.fail("the served plugin never answered")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        left = _kill_servers_on(port)
        if left and sys.exc_info()[0] is None:
            pytest.fail(f"vLLM outlived the pod's start: {left}")


def _kill_servers_on(port: int) -> list[str]:
    import psutil

    left = []
    for server in psutil.process_iter(["cmdline"]):
        cmdline = server.info["cmdline"] or []
        if "--port" in cmdline and str(port) in cmdline and "vllm.entrypoints.openai.api_server" in cmdline:
            left.append(" ".join(cmdline[:3]))
            server.kill()
    return left


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()

