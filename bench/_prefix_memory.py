"""bench/serve_memory.py ``--prefix-cache-memory``: the prefix cache's bytes in use against its budget under a
shared-prefix load that evicts all the time (see that module's docstring)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

from bench._common import free_port, proc_status, save_line_plot, save_results, start_serve_process
from bench._shared_prefix import QUESTIONS, chat_round, system_prompt

MiB = 2**20
POLL_SECONDS = 0.02
CONCURRENCY = 8


def poll_usage(port: int, stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    """Read ``neuronpack_prefix_cache_usage_bytes`` from /metrics until ``stop`` (a read that fails is skipped)."""
    import httpx

    from neuronpack.runtime.engine.metrics import metric_value

    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        while not stop.is_set():
            try:
                usage = metric_value(client.get("/metrics").text, "neuronpack_prefix_cache_usage_bytes")
            except httpx.TransportError:  # a timeout on a busy machine, a kept-alive connection closed
                continue
            samples.append((time.perf_counter(), usage))
            time.sleep(POLL_SECONDS)


def prefix_cache_main(args) -> None:
    import httpx

    from neuronpack.runtime.engine.metrics import metric_value

    base = system_prompt(args.model, 400)
    # Each group's system prompt starts with its own words: no two groups share a block.
    systems = [f"Group {i} of {args.prefixes}, code {i * 7919 % 10007}. {base}" for i in range(args.prefixes)]
    port = free_port()
    serve_args = ["--quiet", "--served-model-name", "smollm2", "--prefix-cache-memory", str(args.prefix_cache_memory),
                  *(["--threads", str(args.threads)] if args.threads else [])]
    proc, _ = start_serve_process(args.artifact, port, serve_args)
    samples: list[tuple[float, float]] = []  # (time, bytes in use)
    stop = threading.Event()
    try:
        idle = proc_status(proc.pid)
        poller = threading.Thread(target=poll_usage, args=(port, stop, samples), daemon=True)
        poller.start()
        started = time.perf_counter()
        rounds = [asyncio.run(chat_round(port, CONCURRENCY, system, QUESTIONS[:CONCURRENCY], args.max_tokens))
                  for _ in range(args.passes) for system in systems]
        seconds = time.perf_counter() - started
        stop.set()
        poller.join()
        after = proc_status(proc.pid)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    budget = metric_value(text, "neuronpack_prefix_cache_budget_bytes")
    series = [(round(t - started, 3), usage) for t, usage in samples]
    peak = max((usage for _, usage in series), default=0.0)
    queries = metric_value(text, "neuronpack_prefix_cache_queries_total")
    hits = metric_value(text, "neuronpack_prefix_cache_hits_total")
    result = {"artifact": str(args.artifact), "prefix_cache_memory_mib": args.prefix_cache_memory,
              "prefixes": args.prefixes, "passes": args.passes, "requests": len(rounds) * CONCURRENCY,
              "concurrency": CONCURRENCY, "max_tokens": args.max_tokens, "seconds": round(seconds, 1),
              "budget_bytes": budget, "usage_max_bytes": peak, "usage_samples": len(series),
              "usage_within_budget": peak <= budget, "usage_series": _changes(series),
              "usage_at_end_bytes": metric_value(text, "neuronpack_prefix_cache_usage_bytes"),
              "prefix_cache_queries": queries, "prefix_cache_hits": hits,
              "ttft_p50_s_median": sorted(r["ttft_p50_s"] for r in rounds)[len(rounds) // 2],
              "idle": idle, "after": after, "loadavg": os.getloadavg()}
    print(f"prefix cache budget {budget / MiB:.1f} MiB; bytes in use: max {result['usage_max_bytes'] / MiB:.1f} MiB "
          f"over {len(series)} samples (within budget: {result['usage_within_budget']}), "
          f"{result['usage_at_end_bytes'] / MiB:.1f} MiB at the end; {result['requests']} requests, {args.prefixes} "
          f"system prompts x {args.passes} passes in {seconds:.0f} s; hits {hits:.0f} of {queries:.0f} prompt tokens; "
          f"VmRSS {idle['VmRSS'] / MiB:.0f} -> {after['VmRSS'] / MiB:.0f} MiB (HWM {after['VmHWM'] / MiB:.0f})")
    path = save_results("serve_memory_prefix" if args.out is None else args.out, result)
    print(f"saved {path} and {plot(path.stem, series, budget)}")


def _changes(series: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The samples where the value changed (and the last one): what the JSON keeps of the series."""
    return [s for i, s in enumerate(series) if i in (0, len(series) - 1) or s[1] != series[i - 1][1]]


def plot(name: str, series: list[tuple[float, float]], budget: float) -> Path:
    return save_line_plot(
        name, [t for t, _ in series], {"neuronpack_prefix_cache_usage_bytes": [u / MiB for _, u in series]},
        step=True, limit=(budget / MiB, "budget (--prefix-cache-memory)"), ylabel="MiB", fontsize=9,
        xlabel="seconds into the load (/metrics read every 20 ms or as fast as the server answers)",
        title="prefix cache bytes in use under an evicting shared-prefix load")
