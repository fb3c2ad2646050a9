"""Compile an artifact's graphs (``config.graphs``: layer graphs and the head) and package them into
``graphs.pt2``.

With AOTInductor and two or more usable cores, the graphs compile in parallel worker processes (each graph's
inductor lowering and C++ build is single-threaded Python + one compiler process, so a second core halves the wall
time). A worker (``python -m neuronpack.backends.torch_aot.compile_worker``, a fresh interpreter:
nothing of the caller's ``__main__`` is re-run, unlike multiprocessing's spawn) reloads the model from the staging
``weights/`` (the exact tensors the artifact ships) and reports the files AOTInductor wrote; the parent packages
them.

Example::

    seconds = compile_graphs(model, plan, config, staging, reporter)   # {"layer_decode": 9.1, ...}
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronpack.backends.torch_aot.layout import DRAFT_GRAPHS, GRAPHS_FILE, WEIGHTS_DIR
from neuronpack.backends.torch_aot.target import INDUCTOR_SETTINGS
from neuronpack.backends.torch_aot.torch_api import aoti_compile, package_aoti_graphs, package_exported_programs
from neuronpack.errors import BuildError

if TYPE_CHECKING:
    from neuronpack.backends.torch_aot.artifact_config import ArtifactConfig


def compile_graphs(model, plan, config: ArtifactConfig, staging: Path, reporter, draft=None) -> dict[str, float]:
    """Export (and with AOTInductor, compile) every graph; package them into ``staging/graphs.pt2``. ``draft``: the
    loaded EAGLE draft when the artifact has draft graphs. ``staging/weights`` (and ``staging/draft``) must already
    hold the weights (the parallel workers read them)."""
    limits = _limits(plan, config)
    names = list(config.graphs)
    workers = min(_parallel_workers(), len(names)) if config.compiler == "aoti" else 1
    seconds, compiled = {}, {}
    with reporter.task(f"compile {len(names)} graphs ({config.compiler}, {workers} at a time)",
                       total=len(names)) as task:
        if workers > 1:
            jobs = _compile_in_workers(Path(staging) / WEIGHTS_DIR, config, limits, workers)
        else:
            jobs = _compile_each(model, draft, names, limits, config)
        for name, result, elapsed in jobs:
            compiled[config.graphs[name]], seconds[name] = result, round(elapsed, 3)
            task.advance()
    with reporter.task("package graphs.pt2", total=1) as task:
        # Packaged in memory (the weights are outside: it is small), then written by Python: torch's archive writer,
        # writing to a full disk, reports only "unexpected pos" and aborts the process from its destructor later;
        # Python's write raises a plain ENOSPC OSError that the pipeline reports as such.
        buffer = io.BytesIO()
        if config.compiler == "aoti":
            package_aoti_graphs(buffer, compiled)
        else:
            package_exported_programs(buffer, compiled)
        with open(Path(staging) / GRAPHS_FILE, "wb") as fh:
            fh.write(buffer.getbuffer())
        task.advance()
    return seconds


def _limits(plan, config: ArtifactConfig):
    from neuronpack.backends.torch_aot.graphs import GraphLimits

    return GraphLimits(batch_size=config.batch_size, max_tokens=config.max_step_tokens, max_seq=plan.seq_len,
                       ring=config.kv_ring)


def _parallel_workers() -> int:
    env = os.environ.get("NEURONPACK_COMPILE_WORKERS")
    if env:
        return max(1, int(env))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores


def _compile_timed(model, name: str, limits, config: ArtifactConfig):
    start = time.perf_counter()
    try:
        result = _compile_one(model, name, limits, config)
    except Exception as exc:  # inductor / export failures surface as one BuildError line
        raise BuildError(f"compiling graph {name} failed: {type(exc).__name__}: {exc}"[:500],
                         where=name, fix="rerun with NEURONPACK_DEBUG=1, or set compiler=export") from exc
    return name, result, time.perf_counter() - start


def _compile_in_workers(weights_dir: Path, config: ArtifactConfig, limits, workers: int):
    """Spread the graphs over ``workers`` processes (each loads the model once); yield (name, files, seconds)."""
    import dataclasses
    import json
    import subprocess
    import sys
    import tempfile

    names = list(config.graphs)
    shares = [names[i::workers] for i in range(workers)]  # layer_decode, layer_step, head: the big two apart
    with tempfile.TemporaryDirectory(prefix="neuronpack-compile-") as tmp:
        procs = []
        for i, share in enumerate(shares):
            job = {"weights_dir": str(weights_dir), "config": config.to_dict(), "limits": dataclasses.asdict(limits),
                   "names": share, "result": str(Path(tmp) / f"worker{i}.json")}
            log = open(Path(tmp) / f"worker{i}.log", "w+")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen([sys.executable, "-m", "neuronpack.backends.torch_aot.compile_worker",
                                            json.dumps(job)], stdout=log, stderr=subprocess.STDOUT), log, job))
        failed = None
        for proc, log, job in procs:
            code = proc.wait()
            log.seek(0)
            tail = [line.strip() for line in log.read().splitlines() if line.strip()][-1:]
            log.close()
            result = Path(job["result"])
            if code != 0 or not result.is_file():
                failed = failed or (", ".join(job["names"]), tail[0] if tail else f"worker exited with {code}")
                continue
            for name, done in json.loads(result.read_text()).items():
                yield name, done["files"], done["seconds"]
        if failed:
            raise BuildError(f"compiling graph {failed[0]} failed: {failed[1]}"[:500], where=failed[0],
                             fix="rerun with NEURONPACK_DEBUG=1 NEURONPACK_COMPILE_WORKERS=1, or set compiler=export")


def compile_in_this_process(weights_dir: Path, config: ArtifactConfig, limits, names: list[str]):
    """The worker's job: reload the staged weights, compile ``names``; yield (name, files, seconds) for each."""
    import torch

    from neuronpack.backends.torch_aot.lora import attach_artifact_lora
    from neuronpack.checkpoint import open_checkpoint
    from neuronpack.models.loading import load_model

    model = load_model(open_checkpoint(Path(weights_dir)), getattr(torch, config.torch_dtype),
                       max_seq_len=limits.max_seq)
    attach_artifact_lora(model, config.lora, Path(weights_dir).parent)  # the staging dir: its lora/ copies
    draft = _staged_draft(Path(weights_dir).parent, config) if set(names) & set(DRAFT_GRAPHS) else None
    yield from _compile_each(model, draft, names, limits, config)


def _compile_each(model, draft, names: list[str], limits, config: ArtifactConfig):
    """Compile ``names`` in this process, the draft graphs from ``draft``; yield (name, result, seconds)."""
    for name in names:
        yield _compile_timed(draft if name in DRAFT_GRAPHS else model, name, limits, config)


def _staged_draft(staging: Path, config: ArtifactConfig):
    """The EAGLE draft as the artifact ships it (``draft/``), loaded as the runtime loads it."""
    import torch

    from neuronpack.models.eagle import load_eagle_draft

    spec = config.speculation
    return load_eagle_draft(Path(staging) / spec.draft, getattr(torch, spec.draft_dtype),
                            target_layers=config.num_layers)


def _compile_one(model, name: str, limits, config: ArtifactConfig) -> Any:
    from neuronpack.backends.torch_aot import graphs as G
    from neuronpack.backends.torch_aot.draft_graphs import export_draft_graph

    export = export_draft_graph if name in DRAFT_GRAPHS else G.export_graph
    program = export(model, name, limits, kernels=config.kernels)
    if config.compiler == "export":
        return program
    module = program.module(check_guards=False)
    return aoti_compile(module, program.example_inputs[0], dict(INDUCTOR_SETTINGS))
