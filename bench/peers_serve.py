"""``neuronpack serve`` against llama.cpp's own server (``llama-server``, continuous batching), equal weight bytes.

One run on SmolLM2-135M-Instruct, same threads (each of ``--threads``, e.g. 1,2): for each precision, neuronpack's
batch-8 artifact served by ``neuronpack serve`` (float32, bfloat16, int8 weights; int8 with the tied head quantized
too, ``include_lm_head``, as Q8_0 quantizes its output matrix) and ``llama-server -np 8 --cont-batching`` on the GGUF
of equal weight bytes (F32, BF16, Q8_0, converted from the same checkpoint by llama.cpp's ``convert_hf_to_gguf.py``;
see bench/peers.py). Both servers are up side by side (an idle one costs nothing) and get the same streamed greedy
completions through the same async openai client (bench/serve.py ``load_round``: ``ignore_eos``, ``--max-tokens``
each), the client on the same machine for both, at concurrency 1, 4 and 8, in ``--rounds`` paired rounds that
alternate between them; figures: the median round's aggregate generated tokens/s and TTFT p50 per side, and the
median per-pair ratio of neuronpack's aggregate to llama-server's, with its spread. Output: a table on stdout,
docs/bench/peers-serve.json and .png (``--out`` names them).

llama-server is not on PyPI as a binary: build it from the llama.cpp tree the llama-cpp-python sdist vendors
(the same llama.cpp as bench/peers.py's), e.g.

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cd llama_cpp_python-0.3.36/vendor/llama.cpp && cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \\
        -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF && \\
        cmake --build build --target llama-server
    .venv/bin/python bench/peers_serve.py --model DIR --gguf-dir DIR --llama-server .../build/bin/llama-server
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import (  # noqa: E402
    NEURONPACK,
    OUT_DIR,
    ROOT,
    free_port,
    save_results,
    start_http_server,
    start_serve_process,
)
from serve import load_round, stop_server  # noqa: E402

PRECISIONS = {"float32": "F32", "bfloat16": "BF16", "int8": "Q8_0"}  # neuronpack dtype -> GGUF of equal bytes
CONCURRENCY = (1, 4, 8)
SLOTS, SEQ_LEN, MAX_CONTEXT = 8, 256, 64


def compiled_artifact(model: Path, dtype: str, out_root: Path) -> Path:
    """``neuronpack compile`` of the CPU recipe as a batch-8 artifact (one context bucket of MAX_CONTEXT, one
    generation bucket of SEQ_LEN) of ``dtype`` ("int8": int8 weights per channel, the head too, float32 compute);
    a cache hit when built before."""
    sets = [f"target.batch_size={SLOTS}", f"target.seq_len={SEQ_LEN}", f"target.max_context_length={MAX_CONTEXT}",
            f"buckets.context=[{MAX_CONTEXT}]", f"buckets.token_generation=[{SEQ_LEN}]",
            f"model.dtype={'float32' if dtype == 'int8' else dtype}"]
    if dtype == "int8":
        sets += ["quantization.dtype=int8", "quantization.include_lm_head=true"]
    argv = [*NEURONPACK, "compile", str(model), "--recipe", str(ROOT / "recipes" / "smollm2-135m-cpu.toml"),
            "--out-root", str(out_root), *[a for s in sets for a in ("--set", s)]]
    return Path(subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def start_llama_server(binary: Path, gguf: Path, port: int, threads: int) -> tuple:
    """``llama-server`` with 8 slots of SEQ_LEN tokens each, continuous batching; (process, seconds to /health)."""
    return start_http_server([str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                              "-np", str(SLOTS), "-c", str(SLOTS * SEQ_LEN), "--cont-batching", "-t", str(threads),
                              "-tb", str(threads), "--alias", "smollm2", "--no-webui"], port)


def measure_pair(start_ours, start_theirs, max_tokens: int, rounds: int) -> list[dict]:
    """Both servers up side by side (an idle one costs nothing), then, per concurrency, ``rounds`` paired rounds
    alternating between them (ours first in even rounds, theirs first in odd ones): one row per concurrency with
    each side's median round and the median of the per-pair ratios with its spread (min, max)."""
    servers = []
    try:
        for start in (start_ours, start_theirs):
            port = free_port()
            servers.append((start(port)[0], port))
        for _, port in servers:
            asyncio.run(load_round(port, 1, 1, 8))  # warm-up
        rows = []
        for c in CONCURRENCY:
            ours, theirs = [], []
            for i in range(rounds):
                order = [(0, ours), (1, theirs)] if i % 2 == 0 else [(1, theirs), (0, ours)]
                for side, into in order:
                    into.append(_round(servers[side][1], c, max_tokens, ("neuronpack", "llama-server")[side]))
            ratios = sorted(a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(ours, theirs, strict=True))
            rows.append({"concurrency": c, "neuronpack": _median_round(ours), "llama_server": _median_round(theirs),
                         "ratio": statistics.median(ratios), "ratio_min": ratios[0], "ratio_max": ratios[-1],
                         "rounds": rounds})
        return rows
    finally:
        for proc, _ in servers:
            stop_server(proc)


def _round(port: int, concurrency: int, max_tokens: int, side: str, attempts: int = 3) -> dict:
    """One load round, run again (up to ``attempts`` in all) when a connection dropped: llama-server sometimes closes
    a kept-alive connection without a response ("Server disconnected without sending a response"; it logs no
    error). Which side dropped goes to stderr."""
    import openai

    for _ in range(attempts - 1):
        try:
            return asyncio.run(load_round(port, concurrency, 2 * concurrency, max_tokens))
        except openai.APIConnectionError as exc:
            print(f"{side} (port {port}) dropped a connection ({exc}); running the round again", file=sys.stderr)
    return asyncio.run(load_round(port, concurrency, 2 * concurrency, max_tokens))


def _median_round(results: list[dict]) -> dict:
    return sorted(results, key=lambda r: r["tokens_per_s"])[len(results) // 2]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the SmolLM2 HF checkpoint (import-gguf output)")
    parser.add_argument("--gguf-dir", type=Path, required=True, help="SmolLM2-135M-Instruct-{F32,BF16,Q8_0}.gguf")
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--threads", default="1,2", help="comma-separated torch / llama.cpp thread counts")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds per concurrency (median reported)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "neuronpack-bench-peers-serve")
    parser.add_argument("--out", default="peers-serve", help="name of the JSON / PNG in docs/bench/")
    args = parser.parse_args(argv)
    rows = []
    threads_list = [int(t) for t in args.threads.split(",")]
    for dtype in args.precisions.split(","):
        gguf = args.gguf_dir / f"SmolLM2-135M-Instruct-{PRECISIONS[dtype]}.gguf"
        artifact = compiled_artifact(args.model, dtype, args.work)
        for threads in threads_list:
            print(f"{dtype}, {threads} threads: neuronpack serve and llama-server {gguf.name}", file=sys.stderr)
            pairs = measure_pair(
                lambda port, a=artifact, t=threads: start_serve_process(
                    a, port, ["--threads", str(t), "--served-model-name", "smollm2", "--quiet"]),
                lambda port, g=gguf, t=threads: start_llama_server(args.llama_server, g, port, t),
                args.max_tokens, args.rounds)
            rows += [{"precision": dtype, "gguf": PRECISIONS[dtype], "threads": threads, **row} for row in pairs]
    result = {"model": "SmolLM2-135M-Instruct", "threads": threads_list, "max_tokens": args.max_tokens,
              "slots": SLOTS, "load_avg_1min_at_end": os.getloadavg()[0], "rows": rows,
              "goal": "neuronpack >= 1.5x llama-server aggregate at 8 concurrent requests (issue 30)"}
    print_table(result)
    print(f"saved {save_results(args.out, result)} and {plot(result, args.out)}")


def print_table(r: dict) -> None:
    print(f"\n{'precision':<17}{'thr':>4}{'conc':>5}{'neuronpack tok/s':>18}{'llama-server tok/s':>20}{'ratio':>7}"
          f"{'spread':>12}{'TTFT p50 np':>13}{'TTFT p50 llama':>16}")
    for row in r["rows"]:
        a, b = row["neuronpack"], row["llama_server"]
        print(f"{row['precision'] + '/' + row['gguf']:<17}{row['threads']:>4}{row['concurrency']:>5}"
              f"{a['tokens_per_s']:>18.1f}"
              f"{b['tokens_per_s']:>20.1f}{row['ratio']:>7.2f}{row['ratio_min']:>6.2f}-{row['ratio_max']:<5.2f}"
              f"{a['ttft_p50_s'] * 1000:>11.0f}ms"
              f"{b['ttft_p50_s'] * 1000:>14.0f}ms")
    print(f"threads {r['threads']}, {r['max_tokens']} tokens per request, 2 x concurrency requests per round, "
          f"median of {r['rows'][0]['rounds']} paired rounds (spread: min-max of the per-pair ratios); "
          f"load average at the end {r['load_avg_1min_at_end']:.1f} on {os.cpu_count()} cores")


def plot(r: dict, name: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(7, 0.45 * len(r["rows"])), 3.5))
    labels = [f"{row['gguf']}\n{row['threads']}t c{row['concurrency']}" for row in r["rows"]]
    ratios = [row["ratio"] for row in r["rows"]]
    spread = [[x - row["ratio_min"] for x, row in zip(ratios, r["rows"], strict=True)],
              [row["ratio_max"] - x for x, row in zip(ratios, r["rows"], strict=True)]]
    bars = ax.bar(labels, ratios, yerr=spread, capsize=2, color="#4a7ab5")
    ax.bar_label(bars, fmt="%.2f")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("neuronpack / llama-server aggregate tok/s")
    ax.set_title(f"serve vs llama-server, SmolLM2-135M, threads {r['threads']}")
    fig.tight_layout()
    path = OUT_DIR / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
