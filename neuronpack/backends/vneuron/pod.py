"""The pod's start of a vneuron artifact: what `neuronpack serve` runs in place of a bare ``vllm serve``.

``python -m neuronpack.backends.vneuron.pod ARTIFACT -- <vllm argv>`` (with the environment launch.py gives):

1. makes the plugin's local compile-cache root anew from the verified artifact (cache.fill_local_root), so every
   graph is a LOCAL hit and nothing an earlier run left there is served; the writable directory around it
   (``VLLM_CACHE_ROOT``) is held for the whole run and names the artifact (artifacts/pod_caches.py), so ``gc``
   leaves it alone while the pod runs and removes it once the artifact is gone;
2. asks the installed plugin, in vLLM's Python and environment (probe.py), which root it resolves, and stops with one
   line when that is not the root it just filled (a ``NEURON_LIBTORCH_CACHE_ROOT`` in the image, say), and when a guard
   variable the plugin reads is off; a guard it does not read is named in a note;
3. starts vLLM and watches the local root while it runs: a graph entry the artifact lacks appearing there means the
   plugin is capturing or compiling at start, which no guard stopped, so vLLM is stopped and the pod exits 1 with
   one line instead of compiling for an hour; once vLLM answers ``/health`` it reports how many packaged graphs were
   hits (the plugin writes ``.cache_accessed`` into an entry on each local hit, cache.py ``get_local`` in 0.21).

SIGTERM / SIGINT / SIGHUP are passed to vLLM's process group; the exit status is vLLM's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from neuronpack.artifacts.pod_caches import pod_cache_in_use
from neuronpack.backends.vllm.serving import server_origin
from neuronpack.backends.vneuron.backend import plugin_cache_root
from neuronpack.backends.vneuron.cache import CACHE_DIR, entry_dirs, fill_local_root
from neuronpack.backends.vneuron.probe import GUARDS
from neuronpack.backends.vneuron.run import healthy, stop_group
from neuronpack.backends.vneuron.variables import CACHE_ROOT
from neuronpack.errors import NeuronpackError, ServeError

ACCESSED = ".cache_accessed"  # written by the plugin's get_local on every local hit (0.21 cache.py)
POLL = 0.5


def start(artifact: Path, vllm_argv: list[str], environ: dict[str, str] | None = None) -> int:
    """Fill, check, run and watch (module docstring); vLLM's exit status. ServeError before vLLM starts."""
    environ = dict(os.environ if environ is None else environ)
    if CACHE_ROOT not in environ:
        raise ServeError(f"{CACHE_ROOT} is not set", where="the pod's environment",
                         fix="start vneuron artifacts with `neuronpack serve`")
    # held while the pod runs (artifacts/pod_caches.py): gc leaves it alone, and removes it once the artifact is gone
    with pod_cache_in_use(Path(environ[CACHE_ROOT]), Path(artifact)) as base:
        root = plugin_cache_root(base)
        packaged = fill_local_root(Path(artifact) / CACHE_DIR, root)
        _say(f"local compile cache {root}: {len(packaged)} graphs copied from the artifact")
        for note in check_plugin(vllm_argv[0], root, environ):
            _say(note)
        return _run_watched(vllm_argv, root, set(packaged), environ)


def check_plugin(python: str, root: Path, environ: dict[str, str]) -> list[str]:
    """Run probe.py in vLLM's Python; ServeError when the plugin resolves another root or has a guard off; notes."""
    out = subprocess.run([python, "-m", "neuronpack.backends.vneuron.probe"], capture_output=True, text=True,
                         env=environ, stdin=subprocess.DEVNULL, timeout=300)
    try:
        found = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise ServeError(f"the plugin could not be asked where its compile cache is ({_last(out.stderr)})",
                         where=python, fix="check that vllm-neuron imports in this Python") from None
    if "vllm_neuron.envs" not in found["roots"]:
        raise ServeError(f"vllm_neuron.envs does not import ({found['errors'].get('vllm_neuron.envs', '?')})",
                         where=python, fix="install the vLLM Neuron plugin the artifact was built with")
    for module, resolved in found["roots"].items():
        if os.path.realpath(resolved) != os.path.realpath(root):
            raise ServeError(f"the plugin's {module} resolves its compile cache to {resolved}, not to the root "
                             f"filled from the artifact ({root}): no graph would be found there",
                             where="the pod's environment",
                             fix="unset NEURON_LIBTORCH_CACHE_ROOT (and any cache root the image sets)")
    read, unread = [], []
    for guard in GUARDS:
        values = found["guards"].get(guard)
        if values and not all(values.values()):
            raise ServeError(f"{guard} is off for the plugin ({values})", where="the pod's environment",
                             fix="do not override the variables `neuronpack serve` sets")
        (read if values else unread).append(guard)
    notes = [f"in force for the installed plugin (its envs modules read them): {', '.join(read) or 'none'}"]
    if unread:
        notes.append(f"not read by its envs modules: {', '.join(unread)} (another release's names, or read in code "
                     "not inspectable here); a compile at start is still caught by watching the local cache")
    return notes


def unexpected_entries(root: Path, packaged: set[str]) -> list[str]:
    """Graph entries in the local root that the artifact did not bring: captured or compiled since the start."""
    return [entry.name for entry in entry_dirs(root) if entry.name not in packaged]


def hits(root: Path, packaged: set[str]) -> int:
    return sum((root / name / ACCESSED).exists() for name in packaged)


# --- private ---------------------------------------------------------------------------------------------------------
def _run_watched(argv: list[str], root: Path, packaged: set[str], environ: dict[str, str]) -> int:
    proc = subprocess.Popen(argv, env=environ, start_new_session=True)
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda signum, _frame: _signal_group(proc, signum))
        served = _watch(proc, root, packaged, _health_url(argv))
    finally:
        stop_group(proc)  # never leave vLLM behind (a no-op once it has exited)
    if not served and proc.returncode:
        _say(f"vLLM exited with code {proc.returncode} before it served (a graph the artifact lacks is an error at "
             "start: VLLM_NEURON_DISABLE_WARMUP_COMPILE)")
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def _watch(proc: subprocess.Popen, root: Path, packaged: set[str], url: str) -> bool:
    """Until vLLM exits: stop it when a graph entry the artifact lacks appears; report the hits once it serves.
    Whether it served."""
    served = False
    while proc.poll() is None:
        new = unexpected_entries(root, packaged)
        if new:
            stop_group(proc)
            raise ServeError(f"the plugin started compiling graph {new[0]} at start, which the artifact does not hold "
                             f"({len(new)} new): vLLM was stopped", where=str(root / new[0]),
                             fix="rebuild the artifact with the serve flags and plugin versions of this pod "
                                 "(`neuronpack compile --force`); `neuronpack doctor` shows the versions")
        if not served and healthy(url):
            served = True
            count = hits(root, packaged)
            detail = (f"{count} of {len(packaged)} packaged graphs were local hits" if count else
                      "the plugin wrote no .cache_accessed marker, so hits are not counted")
            _say(f"vLLM serves: {detail}, none compiled")
        time.sleep(POLL)
    return served


def _health_url(argv: list[str]) -> str:
    host = _flag(argv, "--host") or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"{server_origin(host, int(_flag(argv, '--port') or 8000))}/health"


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


def _say(text: str) -> None:
    print(f"neuronpack: {text}", file=sys.stderr, flush=True)


def _last(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[:300]


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") != 1 or len(argv) < 3:
        print("usage: python -m neuronpack.backends.vneuron.pod ARTIFACT -- VLLM_ARGV...", file=sys.stderr)
        return 2
    try:
        return start(Path(argv[0]), argv[2:])
    except NeuronpackError as exc:
        if os.environ.get("NEURONPACK_DEBUG", "") not in ("", "0", "false"):  # as the CLI's error boundary
            raise
        print(f"error: {exc.one_line()}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
