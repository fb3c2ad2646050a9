"""Resident memory of `neuronpack serve` after a 32-stream load, against weights + KV cache + 300 MB.

Starts ``neuronpack serve ARTIFACT`` on loopback, drives 32 concurrent streaming chat completions with the openai
client (the demo artifact has 4 batch slots: the rest wait in the queue), and reads ``/proc/<pid>/status`` (VmRSS,
VmHWM, RssAnon, RssFile) and ``/proc/<pid>/smaps`` (resident bytes by mapping: weights file, graphs, heap, anonymous
maps) when the server is up and idle, and after the load. With ``--variants``, the same run is repeated under other
environments (e.g. ``MALLOC_ARENA_MAX=2``) to see where memory goes.

    .venv/bin/python -m bench.serve_memory ARTIFACT [--streams 32] [--max-tokens 64] [--variants default,arena2]

Target: VmRSS after the load <= weights + KV cache + 300 MB. Output: table, docs/bench/serve_memory.json + .png.

``--prefix-cache-memory MIB`` (issue 39: the prefix cache's bytes never exceed its budget) measures the prefix cache
instead: the server gets that budget (a small one: a few KV-cache rows), and 8 concurrent clients send chat requests
whose system prompts (~400 tokens) come from ``--prefixes`` groups that share nothing (more than the batch's rows
and the budget's rows together, so cached prefixes are evicted all the time), the groups in turn, ``--passes``
times over. A thread reads ``/metrics`` every 20 ms during the load: the maximum of
``neuronpack_prefix_cache_usage_bytes`` against ``neuronpack_prefix_cache_budget_bytes``, the prefix cache's hits,
and VmRSS / VmHWM before and after. Output: docs/bench/serve_memory_prefix.json + .png.

    .venv/bin/python -m bench.serve_memory ARTIFACT --prefix-cache-memory 64 --model .demo/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench._common import (
    OUT_DIR,
    bench_parser,
    figure,
    free_port,
    old_code,
    proc_status,
    save_results,
    start_serve_process,
)

MiB = 2**20
BUDGET_EXTRA = 300 * MiB
SETTLE_SECONDS = 3.0  # "after the load": this long after the last stream ended
# Environments the server may be started with (on top of the caller's).
VARIANTS = {
    "default": {},
    "arena2": {"MALLOC_ARENA_MAX": "2"},
    "arena1": {"MALLOC_ARENA_MAX": "1"},
}
PROMPTS = [
    "Write a short story about a robot learning to paint.",
    "Explain how a bicycle stays upright, in three sentences.",
    "List five uses of a paperclip.",
    "What is the capital of France? Answer in one sentence.",
]


def artifact_budget(artifact: Path) -> dict:
    """Bytes of the weights (weights/*.safetensors) and of the KV cache (from neuron_config.json)."""
    config = json.loads((artifact / "neuron_config.json").read_text())
    weights = sum(f.stat().st_size for f in (artifact / "weights").glob("*.safetensors"))
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}[config.get("kv_cache_dtype") or config["torch_dtype"]]
    kv = (2 * config["num_layers"] * config["batch_size"] * config["num_kv_heads"] * config["kv_cache_positions"]
          * config["head_dim"] * itemsize)
    return {"weights_bytes": weights, "kv_cache_bytes": kv, "budget_bytes": weights + kv + BUDGET_EXTRA}


def smaps_by_mapping(pid: int) -> dict[str, int]:
    """Resident bytes per mapping kind: each file by name, [heap], and anonymous maps (Python / malloc arenas /
    torch tensors) summed; the largest first."""
    totals: dict[str, int] = {}
    name = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else "[anonymous]"
            name = Path(name).name if name.startswith("/") else name
        elif line.startswith("Rss:") and name is not None:
            totals[name] = totals.get(name, 0) + int(line.split()[1]) * 1024
    return dict(sorted(((k, v) for k, v in totals.items() if v >= MiB), key=lambda kv: -kv[1]))


def drive(port: int, model: str, streams: int, max_tokens: int) -> dict:
    """``streams`` concurrent streaming chat completions; returns tokens and seconds."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)

    def one(i: int) -> int:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], max_tokens=max_tokens,
            stream=True, temperature=0.0)
        return sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content)

    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        tokens = sum(pool.map(one, range(streams)))
    return {"chunks": tokens, "seconds": round(time.perf_counter() - start, 2)}


def measure(artifact: Path, variant: str, streams: int, max_tokens: int, threads: int | None,
            code: Path | None = None, side: str = "after") -> dict:
    port = free_port()
    args = ["--quiet", *(["--threads", str(threads)] if threads else [])]
    proc, start_s = start_serve_process(artifact, port, args, env=VARIANTS[variant], code=code)
    try:
        import httpx

        model = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"]
        idle = proc_status(proc.pid)
        idle_maps = smaps_by_mapping(proc.pid)
        load = drive(port, model, streams, max_tokens)
        time.sleep(0.2)
        just_after = proc_status(proc.pid)
        time.sleep(SETTLE_SECONDS)  # the server releases freed memory once idle (runtime/openai/memory.py)
        after = proc_status(proc.pid)
        after_maps = smaps_by_mapping(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return {"side": side, "variant": variant, "env": VARIANTS[variant], "start_s": round(start_s, 1), "idle": idle,
            "just_after": just_after, "after": after, "load": load, "idle_maps": idle_maps, "after_maps": after_maps}


def main() -> None:
    parser = bench_parser("serve_memory", __doc__, threads=None)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--variants", default="default")
    parser.add_argument("--before-commit", default=None, help="also measure this commit's code (e.g. main)")
    parser.add_argument("--out", default=None, help="name of the JSON / PNG in docs/bench/ (default: serve_memory, "
                        "with --prefix-cache-memory serve_memory_prefix)")
    parser.add_argument("--prefix-cache-memory", type=float, default=None, help="MiB: measure the prefix cache")
    parser.add_argument("--model", type=Path, help="the artifact's HF checkpoint (its tokenizer sizes the prompts)")
    parser.add_argument("--prefixes", type=int, default=16, help="system prompts that share nothing")
    parser.add_argument("--passes", type=int, default=3, help="times over every group of system prompts")
    args = parser.parse_args()
    args.artifact = args.artifact.resolve()
    if args.prefix_cache_memory is not None:
        from bench._prefix_memory import prefix_cache_main

        return prefix_cache_main(args)
    args.out = args.out or "serve_memory"
    budget = artifact_budget(args.artifact)
    load = {"before": os.getloadavg()}
    sides = {"after": None}
    if args.before_commit:
        sides = {"before": old_code(args.before_commit, args.workdir), **sides}
    runs = [measure(args.artifact, v, args.streams, args.max_tokens, args.threads, code, side)
            for side, code in sides.items() for v in args.variants.split(",")]
    load["after"] = os.getloadavg()
    print(f"weights {budget['weights_bytes'] / MiB:.0f} MiB + KV cache {budget['kv_cache_bytes'] / MiB:.0f} MiB "
          f"+ 300 MiB = budget {budget['budget_bytes'] / MiB:.0f} MiB; {args.streams} streams x {args.max_tokens} "
          f"tokens; load {load['before'][0]:.2f} -> {load['after'][0]:.2f}")
    print(f"{'side':7} {'variant':9} {'idle RSS':>9} {'at end':>7} {'RSS after':>10} {'HWM':>7} {'anon':>7} "
          f"{'file':>7} {'x budget':>9} {'over MiB':>9}")
    for r in runs:
        a, limit = r["after"], budget["budget_bytes"]
        print(f"{r['side']:7} {r['variant']:9} {r['idle']['VmRSS'] / MiB:9.0f} "
              f"{r['just_after']['VmRSS'] / MiB:7.0f} {a['VmRSS'] / MiB:10.0f} "
              f"{a['VmHWM'] / MiB:7.0f} {a['RssAnon'] / MiB:7.0f} {a['RssFile'] / MiB:7.0f} "
              f"{a['VmRSS'] / limit:9.2f} {(a['VmRSS'] - limit) / MiB:9.0f}")
        top = ", ".join(f"{k} {v / MiB:.0f}" for k, v in list(r["after_maps"].items())[:6])
        print(f"  resident by mapping after (MiB): {top}; threads {r['after'].get('Threads')}")
    save_results(args.out, {"artifact": str(args.artifact), "streams": args.streams, "max_tokens": args.max_tokens,
                             "loadavg": load, **budget, "runs": runs})
    plot(args.out, runs, budget)
    print(f"saved {OUT_DIR / (args.out + '.json')}")


def plot(name: str, runs: list[dict], budget: dict) -> None:
    with figure(name) as (_, ax):
        labels = [f"{r['side']} {r['variant']}" for r in runs]
        ax.bar(labels, [r["after"]["VmRSS"] / MiB for r in runs], color="#4a7ab5", label="RSS after the load")
        ax.bar(labels, [r["after"]["RssAnon"] / MiB for r in runs], color="#9ab8de", label="of which anonymous")
        ax.axhline(budget["budget_bytes"] / MiB, color="red", linestyle="--", label="weights + KV + 300 MB")
        ax.axhline((budget["weights_bytes"] + budget["kv_cache_bytes"]) / MiB, color="gray", linestyle=":",
                   label="weights + KV")
        ax.set_ylabel("MiB")
        ax.set_title("neuronpack serve resident memory after 32 streams")
        ax.legend(fontsize=8)


if __name__ == "__main__":
    main()
