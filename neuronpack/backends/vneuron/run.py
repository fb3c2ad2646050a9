"""The plugin's own CPU compile, run in a child process and stopped once it is done.

Upstream's CPU compile (``VLLM_NEURON_CPU_COMPILE=1`` with ``NEURON_PLATFORM_TARGET_OVERRIDE``) is a normal
``vllm serve`` start: the worker puts the model on ``meta``, captures one graph per bucket, compiles them with
neuronx-cc into the cache root (``$VLLM_CACHE_ROOT/neuron/compile_cache``), skips the warm-ups and then goes on
starting the API server; it never exits on its own. So the child runs vLLM's OpenAI server on a free loopback port
with a fresh ``VLLM_CACHE_ROOT``, and the compile is done when that server answers ``GET /health`` (vLLM's API server
serves only after ``compile_or_warm_up_model`` returned). Then its whole process group is stopped (SIGTERM, then
SIGKILL). A child that exits first, or that has not served within the recipe's ``compile_timeout``, is a failed
build; cache.py then checks every entry by upstream's rule.

Example::

    seconds = run_cpu_compile(config, model_dir=Path("/models/llama"), cache_base=work / "vllm-cache",
                              log_path=work / "compile.log")
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from neuronpack.backends.vneuron.config import PluginConfig
from neuronpack.errors import BuildError
from neuronpack.progress import NullReporter, Reporter

API_SERVER = "vllm.entrypoints.openai.api_server"
# variables that would send the build's entries elsewhere, disable the cache or the graph capture the CPU compile
# runs on, or turn a miss into an error (the pod's own guards, launch.py, among them)
CLEARED_ENV = ("VLLM_NEURON_REMOTE_CACHE", "VLLM_NEURON_ASSERT_CACHE_HIT", "VLLM_NEURON_DISABLE_WARMUP_COMPILE",
               "VLLM_NEURON_DISABLE_COMPILE_CACHE", "VLLM_NEURON_DISABLE_GRAPH_CAPTURE_BACKEND",
               "NEURON_LIBTORCH_REMOTE_CACHE", "NEURON_LIBTORCH_ASSERT_CACHE_HIT", "NEURON_LIBTORCH_CACHE_ROOT",
               "NEURON_LIBTORCH_DISABLE_COMPILE_CACHE", "NEURON_LIBTORCH_DISABLE_GRAPH_CAPTURE_BACKEND",
               "VLLM_NEURON_CPU_MODE")
STOP_GRACE = 30.0  # seconds between SIGTERM and SIGKILL


def compile_command(config: PluginConfig, model_dir: Path, port: int, python: str = sys.executable) -> list[str]:
    """The child's command line: vLLM's OpenAI server with the artifact's flags, on loopback."""
    return [python, "-m", API_SERVER, "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
            *config.vllm_flags()]


def compile_env(config: PluginConfig, cache_base: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: CPU compile for the recipe's target and LNC into ``cache_base``."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if k not in CLEARED_ENV}
    return {**env, **config.env, "VLLM_NEURON_CPU_COMPILE": "1", "VLLM_CACHE_ROOT": str(cache_base)}


def run_cpu_compile(config: PluginConfig, *, model_dir: Path, cache_base: Path, log_path: Path,
                    reporter: Reporter | None = None, python: str = sys.executable, poll: float = 0.5) -> float:
    """Run the CPU compile to completion; seconds it took. BuildError (with the log's last line) otherwise."""
    reporter = reporter or NullReporter()
    port = _free_port()
    start = time.monotonic()
    with open(log_path, "wb") as log, reporter.task(f"vLLM Neuron CPU compile ({config.instance}, tp "
                                                    f"{config.tensor_parallel_size}, lnc {config.lnc})") as task:
        proc = subprocess.Popen(compile_command(config, model_dir, port, python), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=compile_env(config, cache_base), start_new_session=True)
        try:
            while not healthy(f"http://127.0.0.1:{port}/health"):
                code = proc.poll()
                if code is not None:
                    raise BuildError(f"the plugin's CPU compile exited with code {code} before it served "
                                     f"({_last_line(log_path)})", where=str(log_path),
                                     fix="read the log; `neuronpack doctor` shows whether vllm, vllm-neuron and "
                                         "neuronx-cc are installed")
                elapsed = time.monotonic() - start
                if elapsed > config.compile_timeout:
                    raise BuildError(f"the plugin's CPU compile did not finish within {config.compile_timeout} s "
                                     f"({_last_line(log_path)})", where=str(log_path),
                                     fix="raise [vneuron] compile_timeout, or read the log for a hang")
                if int(elapsed) // 30 != int(elapsed - poll) // 30:  # a heartbeat every 30 s (plain logs stay short)
                    task.describe(f"vLLM Neuron CPU compile: {elapsed:.0f} s")
                time.sleep(poll)
        finally:
            stop_group(proc)
    return time.monotonic() - start


def healthy(url: str) -> bool:
    """Whether vLLM's server answers ``GET /health`` (it serves only after ``compile_or_warm_up_model`` returned)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def stop_group(proc: subprocess.Popen) -> None:
    """Stop the child's whole process group (vLLM starts engine and worker processes of its own)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# --- private ---------------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _last_line(log_path: Path) -> str:
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return (lines[-1] if lines else "the log is empty")[:300]
