"""Compile an artifact's two graphs (context, token generation) and package them into ``graphs.pt2``.

With AOTInductor and two or more usable cores, the two graphs compile at the same time in two worker processes
(each graph's inductor lowering and C++ build is single-threaded Python + one compiler process, so a second core
halves the wall time). A worker (``python -m neuronpack.backends.torch_aot.compile_worker``, a fresh interpreter:
nothing of the caller's ``__main__`` is re-run, unlike multiprocessing's spawn) reloads the model from the staging
``weights/`` (the exact tensors the artifact ships) and reports the files AOTInductor wrote; the parent packages
them.

Example::

    seconds = compile_graphs(model, plan, config, staging, reporter)   # {"context": 41.2, "token_generation": 39.8}
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any

from neuronpack.backends.torch_aot import layout as L
from neuronpack.backends.torch_aot.layout import GRAPHS_FILE, WEIGHTS_DIR
from neuronpack.backends.torch_aot.target import INDUCTOR_SETTINGS
from neuronpack.errors import BuildError


def compile_graphs(model, plan, config: dict, staging: Path, reporter) -> dict[str, float]:
    """Export (and with AOTInductor, compile) both graphs; package them into ``staging/graphs.pt2``.
    ``staging/weights`` must already hold the model's weights (the parallel workers read them)."""
    limits = _limits(plan, config)
    workers = _parallel_workers() if config["compiler"] == "aoti" else 1
    seconds, compiled = {}, {}
    with reporter.task(f"compile {len(L.GRAPH_KINDS)} graphs ({config['compiler']}, {workers} at a time)",
                       total=len(L.GRAPH_KINDS)) as task:
        if workers > 1:
            jobs = _compile_in_workers(Path(staging) / WEIGHTS_DIR, config, limits, workers)
        else:
            jobs = (_compile_timed(model, kind, limits, config) for kind in L.GRAPH_KINDS)
        for kind, result, elapsed in jobs:
            compiled[config["graphs"][kind]], seconds[kind] = result, round(elapsed, 3)
            task.advance()
    with reporter.task("package graphs.pt2", total=1) as task:
        # Packaged in memory (the weights are outside: it is small), then written by Python: torch's archive writer,
        # writing to a full disk, reports only "unexpected pos" and aborts the process from its destructor later;
        # Python's write raises a plain ENOSPC OSError that the pipeline reports as such.
        buffer = io.BytesIO()
        if config["compiler"] == "aoti":
            from torch._inductor.package import package_aoti

            package_aoti(buffer, compiled)
        else:
            from torch.export.pt2_archive._package import package_pt2

            package_pt2(buffer, exported_programs=compiled)
        with open(Path(staging) / GRAPHS_FILE, "wb") as fh:
            fh.write(buffer.getbuffer())
        task.advance()
    return seconds


def _limits(plan, config: dict):
    from neuronpack.backends.torch_aot.graphs import GraphLimits

    return GraphLimits(batch_size=config["batch_size"], max_tokens=config["max_step_tokens"], max_seq=plan.seq_len)


def _parallel_workers() -> int:
    env = os.environ.get("NEURONPACK_COMPILE_WORKERS")
    if env:
        return max(1, int(env))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(len(L.GRAPH_KINDS), cores)


def _compile_timed(model, kind: str, limits, config: dict):
    start = time.perf_counter()
    try:
        result = _compile_one(model, kind, limits, config)
    except Exception as exc:  # inductor / export failures surface as one BuildError line
        raise BuildError(f"compiling graph {kind} failed: {type(exc).__name__}: {exc}"[:500],
                         where=kind, fix="rerun with NEURONPACK_DEBUG=1, or set compiler=export") from exc
    return kind, result, time.perf_counter() - start


def _compile_in_workers(weights_dir: Path, config: dict, limits, workers: int):
    import dataclasses
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="neuronpack-compile-") as tmp:
        procs = {}
        for kind in L.GRAPH_KINDS:
            job = {"weights_dir": str(weights_dir), "config": config, "limits": dataclasses.asdict(limits),
                   "kind": kind, "result": str(Path(tmp) / f"{kind}.json")}
            log = open(Path(tmp) / f"{kind}.log", "w+")  # noqa: SIM115 - closed below
            procs[kind] = (subprocess.Popen([sys.executable, "-m", "neuronpack.backends.torch_aot.compile_worker",
                                             json.dumps(job)], stdout=log, stderr=subprocess.STDOUT), log, job)
        failed = None
        for kind, (proc, log, job) in procs.items():
            code = proc.wait()
            log.seek(0)
            tail = [line.strip() for line in log.read().splitlines() if line.strip()][-1:]
            log.close()
            result = Path(job["result"])
            if code != 0 or not result.is_file():
                failed = failed or (kind, tail[0] if tail else f"worker exited with {code}")
                continue
            done = json.loads(result.read_text())
            yield kind, done["files"], done["seconds"]
        if failed:
            raise BuildError(f"compiling graph {failed[0]} failed: {failed[1]}"[:500], where=failed[0],
                             fix="rerun with NEURONPACK_DEBUG=1 NEURONPACK_COMPILE_WORKERS=1, or set compiler=export")


def compile_in_this_process(weights_dir: Path, config: dict, limits, kind: str):
    """The worker's job: reload the staged weights, compile ``kind``; return (kind, files, seconds)."""
    import torch

    from neuronpack.checkpoint import open_checkpoint
    from neuronpack.models.loading import load_model

    model = load_model(open_checkpoint(Path(weights_dir)), getattr(torch, config["torch_dtype"]),
                       max_seq_len=limits.max_seq)
    return _compile_timed(model, kind, limits, config)


def _compile_one(model, kind: str, limits, config: dict) -> Any:
    import torch

    from neuronpack.backends.torch_aot import graphs as G

    caches = G.new_kv_cache(model, limits.batch_size, limits.max_seq, next(model.parameters()).dtype)
    if config["compiler"] == "export":
        return G.export_weightless_graph(model, limits, caches)
    program = G.export_graph(model, limits, caches)
    module = program.module(check_guards=False)
    return torch._inductor.aot_compile(module, program.example_inputs[0], options=dict(INDUCTOR_SETTINGS))
