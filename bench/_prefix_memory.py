"""bench/serve_memory.py ``--prefix-cache-memory``: the prefix cache's bytes in use against its budget under a
shared-prefix load that evicts all the time (see that module's docstring)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

from _common import OUT_DIR, free_port, save_results, start_serve_process
from _shared_prefix import QUESTIONS, chat_round, system_prompt

MiB = 2**20
POLL_SECONDS = 0.02
CONCURRENCY = 8


def poll_usage(port: int, stop: threading.Event, samples: list[float]) -> None:
    """Read ``neuronpack_prefix_cache_usage_bytes`` from /metrics until ``stop`` (a read that fails is skipped)."""
    import httpx

    from neuronpack.runtime.metrics import metric_value

    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        while not stop.is_set():
            try:
                samples.append(metric_value(client.get("/metrics").text, "neuronpack_prefix_cache_usage_bytes"))
            except httpx.TransportError:  # a timeout on a busy machine, a kept-alive connection closed
                continue
            time.sleep(POLL_SECONDS)


def prefix_cache_main(args) -> None:
    import httpx
    from serve_memory import status

    from neuronpack.runtime.metrics import metric_value

    base = system_prompt(args.model, 400)
    # Each group's system prompt starts with its own words: no two groups share a block.
    systems = [f"Group {i} of {args.prefixes}, code {i * 7919 % 10007}. {base}" for i in range(args.prefixes)]
    port = free_port()
    serve_args = ["--quiet", "--served-model-name", "smollm2", "--prefix-cache-memory", str(args.prefix_cache_memory),
                  *(["--threads", str(args.threads)] if args.threads else [])]
    proc, _ = start_serve_process(args.artifact, port, serve_args)
    samples: list[float] = []
    stop = threading.Event()
    try:
        idle = status(proc.pid)
        poller = threading.Thread(target=poll_usage, args=(port, stop, samples), daemon=True)
        poller.start()
        started = time.perf_counter()
        rounds = [asyncio.run(chat_round(port, CONCURRENCY, system, QUESTIONS[:CONCURRENCY], args.max_tokens))
                  for _ in range(args.passes) for system in systems]
        seconds = time.perf_counter() - started
        stop.set()
        poller.join()
        after = status(proc.pid)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    budget = metric_value(text, "neuronpack_prefix_cache_budget_bytes")
    queries = metric_value(text, "neuronpack_prefix_cache_queries_total")
    hits = metric_value(text, "neuronpack_prefix_cache_hits_total")
    result = {"artifact": str(args.artifact), "prefix_cache_memory_mib": args.prefix_cache_memory,
              "prefixes": args.prefixes, "passes": args.passes, "requests": len(rounds) * CONCURRENCY,
              "concurrency": CONCURRENCY, "max_tokens": args.max_tokens, "seconds": round(seconds, 1),
              "budget_bytes": budget, "usage_max_bytes": max(samples, default=0.0), "usage_samples": len(samples),
              "usage_within_budget": max(samples, default=0.0) <= budget,
              "usage_at_end_bytes": metric_value(text, "neuronpack_prefix_cache_usage_bytes"),
              "prefix_cache_queries": queries, "prefix_cache_hits": hits,
              "ttft_p50_s_median": sorted(r["ttft_p50_s"] for r in rounds)[len(rounds) // 2],
              "idle": idle, "after": after, "loadavg": os.getloadavg()}
    print(f"prefix cache budget {budget / MiB:.1f} MiB; bytes in use: max {result['usage_max_bytes'] / MiB:.1f} MiB "
          f"over {len(samples)} samples (within budget: {result['usage_within_budget']}), "
          f"{result['usage_at_end_bytes'] / MiB:.1f} MiB at the end; {result['requests']} requests, {args.prefixes} "
          f"system prompts x {args.passes} passes in {seconds:.0f} s; hits {hits:.0f} of {queries:.0f} prompt tokens; "
          f"VmRSS {idle['VmRSS'] / MiB:.0f} -> {after['VmRSS'] / MiB:.0f} MiB (HWM {after['VmHWM'] / MiB:.0f})")
    path = save_results("serve_memory_prefix" if args.name is None else args.name, result)
    print(f"saved {path} and {plot(path.stem, samples, budget)}")


def plot(name: str, samples: list[float], budget: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot([i * POLL_SECONDS for i in range(len(samples))], [s / MiB for s in samples], color="#4a7ab5",
            label="neuronpack_prefix_cache_usage_bytes")
    ax.axhline(budget / MiB, color="red", linestyle="--", label="budget (--prefix-cache-memory)")
    ax.set_xlabel("sample (every ~20 ms of the load)")
    ax.set_ylabel("MiB")
    ax.set_ylim(0, budget / MiB * 1.3 or 1)
    ax.set_title("prefix cache bytes in use under an evicting shared-prefix load", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = OUT_DIR / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
