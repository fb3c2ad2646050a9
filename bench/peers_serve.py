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

``--shared-prefix`` (issue 39): a chat application's load instead. 8 concurrent clients send streamed greedy chat
requests (``--max-tokens`` each, ``ignore_eos``) that share one ~400-token system prompt and differ in a short user
message (16 questions per round), to three servers up side by side: neuronpack with prefix caching off (every prompt
prefilled whole: the "before"), neuronpack with it on (the default: the "after"), and llama-server with its prompt
cache on (``cache_prompt``, its default, also sent with every request; ``-np 8`` slots of SHARED_SEQ_LEN tokens
each). neuronpack serves a batch-8 float32 artifact with context bucket 512 and SHARED_SEQ_LEN positions
(``--precisions`` picks others). Each server gets one untimed round first (llama-server's slots and neuronpack's rows
see the system prompt once), then ``--rounds`` rounds, the order of the three rotating; figures: each side's median
TTFT p50 and aggregate tokens/s over the rounds (with min-max), and the median per-round ratios to llama-server.
Output: docs/bench/peers-serve-prefix.json and .png. Targets: TTFT p50 <= llama-server's, tokens/s >= 1.5x.

``--mixed`` (issue 49): 6 chat clients stream requests one after the other (a short system prompt, a question,
``--max-tokens`` each) while a seventh sends a ~900-token prompt every 4 s (3 of them, each beginning differently)
(bench/_mixed_load.py), to three servers up side by side on a batch-8 artifact of 1024 positions: neuronpack with
``--before-commit``'s code (one long prompt prefilled in one step) and this checkout's (chunked prefill between
decode steps), and llama-server (8 slots of 1024). Figures per side, medians over ``--rounds``: the chat streams'
inter-token gaps (p50, p99, max), chat TTFT p50, the long prompts' TTFT, chat tokens/s. Output:
docs/bench/peers-serve-mixed.json and .png.

llama-server is not on PyPI as a binary: build it from the llama.cpp tree the llama-cpp-python sdist vendors
(the same llama.cpp as bench/peers.py's), e.g.

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cd llama_cpp_python-0.3.36/vendor/llama.cpp && cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \\
        -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF && \\
        cmake --build build --target llama-server
    .venv/bin/python -m bench.peers_serve --model DIR --gguf-dir DIR --llama-server .../build/bin/llama-server
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench._common import (
    NEURONPACK,
    OUT_DIR,
    ROOT,
    bench_parser,
    figure,
    free_port,
    grouped_bars,
    save_results,
    start_http_server,
    start_serve_process,
)
from bench._shared_prefix import QUESTIONS, chat_round, system_prompt
from bench.serve import load_round, stop_server

PRECISIONS = {"float32": "F32", "bfloat16": "BF16", "int8": "Q8_0"}  # neuronpack dtype -> GGUF of equal bytes
CONCURRENCY = (1, 4, 8)
SLOTS, SEQ_LEN, MAX_CONTEXT = 8, 256, 64
# --shared-prefix: a ~400-token system prompt + a question + max_tokens fit in SHARED_SEQ_LEN positions per row / slot.
SHARED_SEQ_LEN, SHARED_CONTEXT, SYSTEM_TOKENS = 576, 512, 400


def compiled_artifact(model: Path, dtype: str, out_root: Path, seq_len: int = SEQ_LEN,
                      max_context: int = MAX_CONTEXT) -> Path:
    """``neuronpack compile`` of the CPU recipe as a batch-8 artifact (one context bucket of ``max_context``, one
    generation bucket of ``seq_len``) of ``dtype`` ("int8": int8 weights per channel, the head too, float32 compute);
    a cache hit when built before."""
    sets = [f"target.batch_size={SLOTS}", f"target.seq_len={seq_len}", f"target.max_context_length={max_context}",
            f"buckets.context=[{max_context}]", f"buckets.token_generation=[{seq_len}]",
            f"model.dtype={'float32' if dtype == 'int8' else dtype}"]
    if dtype == "int8":
        sets += ["quantization.dtype=int8", "quantization.include_lm_head=true"]
    argv = [*NEURONPACK, "compile", str(model), "--recipe", str(ROOT / "recipes" / "smollm2-135m-cpu.toml"),
            "--out-root", str(out_root), *[a for s in sets for a in ("--set", s)]]
    return Path(subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def start_llama_server(binary: Path, gguf: Path, port: int, threads: int, seq_len: int = SEQ_LEN) -> tuple:
    """``llama-server`` with 8 slots of ``seq_len`` tokens each, continuous batching; (process, seconds to
    /health)."""
    return start_http_server([str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                              "-np", str(SLOTS), "-c", str(SLOTS * seq_len), "--cont-batching", "-t", str(threads),
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


def _round(port: int, concurrency: int, max_tokens: int, side: str) -> dict:
    return _again_when_dropped(lambda: load_round(port, concurrency, 2 * concurrency, max_tokens), port, side)


def _again_when_dropped(round_, port: int, side: str, attempts: int = 3) -> dict:
    """``asyncio.run(round_())``, run again (up to ``attempts`` in all) when a connection dropped: llama-server
    sometimes closes a kept-alive connection without a response ("Server disconnected without sending a response";
    it logs no error). Which side dropped goes to stderr."""
    import openai

    for _ in range(attempts - 1):
        try:
            return asyncio.run(round_())
        except openai.APIConnectionError as exc:
            print(f"{side} (port {port}) dropped a connection ({exc}); running the round again", file=sys.stderr)
    return asyncio.run(round_())


def _median_round(results: list[dict]) -> dict:
    return sorted(results, key=lambda r: r["tokens_per_s"])[len(results) // 2]


SHARED_SIDES = ("neuronpack, prefix cache off", "neuronpack, prefix cache on", "llama-server, cache_prompt on")


def measure_shared_prefix(starts: list, system: str, max_tokens: int, rounds: int) -> dict:
    """The three servers of ``--shared-prefix`` (SHARED_SIDES, started by ``starts``) up side by side; one untimed
    round each, then ``rounds`` rounds of 8 concurrent clients over the 16 questions, the order of the sides
    rotating. Per side: every round, the median TTFT p50 and tokens/s with their min-max; per neuronpack side the
    median per-round ratios to llama-server's; the cache-on server's prefix cache counters."""
    import httpx

    extra = ({}, {}, {"cache_prompt": True})  # llama-server's default, sent anyway: the comparison needs it on
    servers = []
    try:
        for start in starts:
            port = free_port()
            servers.append((start(port)[0], port))
        for (_, port), body, name in zip(servers, extra, SHARED_SIDES, strict=True):  # warm-up
            _again_when_dropped(lambda p=port, b=body: chat_round(p, SLOTS, system, QUESTIONS[:SLOTS], max_tokens, b),
                                port, name)
        results: list[list[dict]] = [[] for _ in servers]
        for i in range(rounds):
            for side in [(i + k) % len(servers) for k in range(len(servers))]:
                port = servers[side][1]
                results[side].append(_again_when_dropped(
                    lambda p=port, b=extra[side]: chat_round(p, SLOTS, system, QUESTIONS, max_tokens, b),
                    port, SHARED_SIDES[side]))
        metrics = httpx.get(f"http://127.0.0.1:{servers[1][1]}/metrics").text
    finally:
        for proc, _ in servers:
            stop_server(proc)
    theirs = results[-1]
    sides = []
    for name, ours in zip(SHARED_SIDES, results, strict=True):
        side = {"side": name, "rounds": ours}
        for key in ("ttft_p50_s", "tokens_per_s"):
            values = sorted(r[key] for r in ours)
            side[key] = {"median": statistics.median(values), "min": values[0], "max": values[-1]}
        if ours is not theirs:
            side["ttft_vs_llama_server"] = statistics.median(
                a["ttft_p50_s"] / b["ttft_p50_s"] for a, b in zip(ours, theirs, strict=True))
            side["throughput_vs_llama_server"] = statistics.median(
                a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(ours, theirs, strict=True))
        sides.append(side)
    counters = [line for line in metrics.splitlines() if line.startswith("neuronpack_prefix_cache")]
    return {"sides": sides, "prefix_cache_metrics": counters}


def shared_prefix_main(args) -> None:
    """``--shared-prefix``: one row per precision and thread count of the three sides (``measure_shared_prefix``)."""
    system = system_prompt(args.model, SYSTEM_TOKENS)
    rows = []
    for dtype in args.precisions.split(","):
        gguf = args.gguf_dir / f"SmolLM2-135M-Instruct-{PRECISIONS[dtype]}.gguf"
        artifact = compiled_artifact(args.model, dtype, args.workdir, SHARED_SEQ_LEN, SHARED_CONTEXT)
        for threads in [int(t) for t in args.threads.split(",")]:
            print(f"{dtype}, {threads} threads, shared prefix: neuronpack serve (cache off, on), llama-server",
                  file=sys.stderr)
            serve_args = ["--threads", str(threads), "--served-model-name", "smollm2", "--quiet"]
            starts = [lambda port, a=artifact, s=serve_args: start_serve_process(
                          a, port, [*s, "--no-enable-prefix-caching"]),
                      lambda port, a=artifact, s=serve_args: start_serve_process(a, port, s),
                      lambda port, g=gguf, t=threads: start_llama_server(args.llama_server, g, port, t,
                                                                         SHARED_SEQ_LEN)]
            rows.append({"precision": dtype, "gguf": PRECISIONS[dtype], "threads": threads,
                         **measure_shared_prefix(starts, system, args.max_tokens, args.rounds)})
    result = {"model": "SmolLM2-135M-Instruct", "max_tokens": args.max_tokens, "slots": SLOTS,
              "concurrency": SLOTS, "requests_per_round": len(QUESTIONS), "rounds": args.rounds,
              "system_prompt_tokens": SYSTEM_TOKENS, "seq_len": SHARED_SEQ_LEN,
              "load_avg_1min_at_end": os.getloadavg()[0], "rows": rows,
              "goal": "TTFT p50 <= llama-server's (prompt cache on), aggregate tokens/s >= 1.5x (issue 39)"}
    print_shared_table(result)
    path = save_results("peers-serve-prefix" if args.out is None else args.out, result)
    print(f"saved {path} and {plot_shared(result, path.stem)}")


MIXED_SIDES = ("neuronpack before (--before-commit)", "neuronpack", "llama-server")
MIXED_SEQ_LEN, MIXED_CONTEXT, MIXED_LONG_TOKENS, MIXED_CHATS = 1024, 512, 900, 6


def mixed_main(args) -> None:
    """``--mixed``: chat streams while ~900-token prompts arrive (bench/_mixed_load.py), against llama-server, on a
    batch-8 artifact of 1024 positions (llama-server: 8 slots of 1024); neuronpack's code before (``--before-commit``)
    and after, the three sides up side by side, one untimed round each, then ``--rounds`` rounds, the order
    rotating."""
    import transformers

    from bench._common import old_code
    from bench._mixed_load import mixed_round
    from bench._shared_prefix import SYSTEM, chat_ids, grow_system

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    long_text = grow_system(lambda text: len(chat_ids(tokenizer, "", text)), MIXED_LONG_TOKENS)
    dtype = args.precisions.split(",")[0]
    gguf = args.gguf_dir / f"SmolLM2-135M-Instruct-{PRECISIONS[dtype]}.gguf"
    artifact = compiled_artifact(args.model, dtype, args.workdir, MIXED_SEQ_LEN, MIXED_CONTEXT)
    before = old_code(args.before_commit, args.workdir)
    load = {"chats": MIXED_CHATS, "longs": 3, "every_s": 4.0, "max_tokens": args.max_tokens}
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        serve_args = ["--threads", str(threads), "--served-model-name", "smollm2", "--quiet"]
        starts = [lambda port, s=serve_args: start_serve_process(artifact, port, s, code=before),
                  lambda port, s=serve_args: start_serve_process(artifact, port, s),
                  lambda port, t=threads: start_llama_server(args.llama_server, gguf, port, t, MIXED_SEQ_LEN)]
        servers = []
        try:
            for start in starts:
                port = free_port()
                servers.append((start(port)[0], port))
            results: list[list[dict]] = [[] for _ in servers]
            for i in range(args.rounds + 1):
                for side in [(i + k) % len(servers) for k in range(len(servers))]:
                    port = servers[side][1]
                    result = _again_when_dropped(lambda p=port: mixed_round(p, SYSTEM, long_text, **load), port,
                                                 MIXED_SIDES[side])
                    if i:  # round 0 warms every side up
                        results[side].append(result)
        finally:
            for proc, _ in servers:
                stop_server(proc)
        sides = [{"side": name, "rounds": rs, **{k: statistics.median(r[k] for r in rs) for k in rs[0]}}
                 for name, rs in zip(MIXED_SIDES, results, strict=True)]
        rows.append({"precision": dtype, "threads": threads, "sides": sides})
    result = {"model": "SmolLM2-135M-Instruct", "slots": SLOTS, "seq_len": MIXED_SEQ_LEN, "rounds": args.rounds,
              "long_prompt_tokens": MIXED_LONG_TOKENS, "before_commit": args.before_commit, **load,
              "load_avg_1min_at_end": os.getloadavg()[0], "rows": rows,
              "goal": "chat streams' p99 inter-token gap and TTFT while long prompts arrive, against llama-server "
                      "(issue 49)"}
    keys = ("gap_p50_ms", "gap_p99_ms", "gap_max_ms", "chat_ttft_p50_ms", "long_ttft_p50_ms", "chat_tokens_per_s")
    print(f"\n{'thr':>3}  {'side':<36}" + "".join(f"{k:>18}" for k in keys))
    for row in rows:
        for side in row["sides"]:
            print(f"{row['threads']:>3}  {side['side']:<36}" + "".join(f"{side[k]:>18.1f}" for k in keys))
    path = save_results("peers-serve-mixed" if args.out is None else args.out, result)
    with figure(path.stem, figsize=(10, 3.6), ncols=2) as (_, axes):
        groups = [f"{row['threads']} thread{'s' if row['threads'] > 1 else ''}" for row in rows]
        for ax, key, label in zip(axes, ("gap_p99_ms", "chat_ttft_p50_ms"),
                                  ("chat streams' p99 inter-token gap, ms", "chat TTFT p50, ms"), strict=True):
            grouped_bars(ax, groups, {name: [row["sides"][j][key] for row in rows]
                                      for j, name in enumerate(MIXED_SIDES)}, fmt="%.0f", fontsize=7)
            ax.set_ylabel(label)
            ax.legend(fontsize=7)
    print(f"saved {path}")


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("peers_serve", __doc__, model="required", rounds=3)
    parser.add_argument("--gguf-dir", type=Path, required=True, help="SmolLM2-135M-Instruct-{F32,BF16,Q8_0}.gguf")
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--threads", default="1,2", help="comma-separated torch / llama.cpp thread counts")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--out", default=None, help="name of the JSON / PNG in docs/bench/ (default: peers-serve, "
                        "with --shared-prefix peers-serve-prefix)")
    parser.add_argument("--shared-prefix", action="store_true",
                        help="8 clients sharing a ~400-token system prompt, neuronpack's prefix cache off and on")
    parser.add_argument("--mixed", action="store_true",
                        help="6 chat streams while ~900-token prompts arrive every 4 s, before / after / llama-server")
    parser.add_argument("--before-commit", default="main", help="--mixed: the code of the 'before' side")
    args = parser.parse_args(argv)
    if args.shared_prefix:
        return shared_prefix_main(args)
    if args.mixed:
        return mixed_main(args)
    rows = []
    threads_list = [int(t) for t in args.threads.split(",")]
    for dtype in args.precisions.split(","):
        gguf = args.gguf_dir / f"SmolLM2-135M-Instruct-{PRECISIONS[dtype]}.gguf"
        artifact = compiled_artifact(args.model, dtype, args.workdir)
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
    path = save_results("peers-serve" if args.out is None else args.out, result)
    print(f"saved {path} and {plot(result, path.stem)}")


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
    with figure(name, figsize=(max(7, 0.45 * len(r["rows"])), 3.5)) as (_, ax):
        labels = [f"{row['gguf']}\n{row['threads']}t c{row['concurrency']}" for row in r["rows"]]
        ratios = [row["ratio"] for row in r["rows"]]
        spread = [[x - row["ratio_min"] for x, row in zip(ratios, r["rows"], strict=True)],
                  [row["ratio_max"] - x for x, row in zip(ratios, r["rows"], strict=True)]]
        bars = ax.bar(labels, ratios, yerr=spread, capsize=2, color="#4a7ab5")
        ax.bar_label(bars, fmt="%.2f")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel("neuronpack / llama-server aggregate tok/s")
        ax.set_title(f"serve vs llama-server, SmolLM2-135M, threads {r['threads']}")
    return OUT_DIR / f"{name}.png"


def print_shared_table(r: dict) -> None:
    print(f"\n{'precision':<10}{'thr':>4}  {'side':<32}{'TTFT p50 ms (min-max)':>24}{'tok/s (min-max)':>22}"
          f"{'TTFT / llama':>14}{'tok/s / llama':>15}")
    for row in r["rows"]:
        for side in row["sides"]:
            t, v = side["ttft_p50_s"], side["tokens_per_s"]
            ratios = (f"{side['ttft_vs_llama_server']:>14.2f}{side['throughput_vs_llama_server']:>15.2f}"
                      if "ttft_vs_llama_server" in side else "")
            print(f"{row['gguf']:<10}{row['threads']:>4}  {side['side']:<32}"
                  f"{t['median'] * 1000:>9.0f} ({t['min'] * 1000:.0f}-{t['max'] * 1000:.0f}){'':>5}"
                  f"{v['median']:>9.1f} ({v['min']:.0f}-{v['max']:.0f}){'':>3}{ratios}")
        print(f"  {'; '.join(row['prefix_cache_metrics'])}")
    print(f"{r['concurrency']} concurrent clients, {r['requests_per_round']} requests of {r['max_tokens']} tokens per "
          f"round, a ~{r['system_prompt_tokens']}-token shared system prompt, median of {r['rounds']} rounds; load "
          f"average at the end {r['load_avg_1min_at_end']:.1f} on {os.cpu_count()} cores")


def plot_shared(r: dict, name: str) -> Path:
    colors = ["#999999", "#4a7ab5", "#c07a3a"]
    with figure(name, figsize=(11, 3.8), ncols=2) as (fig, axes):
        for ax, key, label in zip(axes, ("ttft_p50_s", "tokens_per_s"), ("TTFT p50, ms", "aggregate tokens/s"),
                                  strict=True):
            labels, values, low, high, fill = [], [], [], [], []
            for row in r["rows"]:
                for i, side in enumerate(row["sides"]):
                    scale = 1000 if key == "ttft_p50_s" else 1
                    m = side[key]
                    labels.append(f"{side['side'].replace(', ', chr(10))}\n{row['gguf']} {row['threads']}t")
                    values.append(m["median"] * scale)
                    low.append((m["median"] - m["min"]) * scale)
                    high.append((m["max"] - m["median"]) * scale)
                    fill.append(colors[i])
            bars = ax.bar(range(len(values)), values, yerr=[low, high], capsize=3, color=fill)
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
            ax.set_xticks(range(len(values)), labels, fontsize=7)
            ax.set_ylabel(f"{label} (median, bars: min-max)")
            if key == "ttft_p50_s":
                ax.set_yscale("log")
        fig.suptitle(f"8 clients, shared ~{r['system_prompt_tokens']}-token system prompt: neuronpack serve vs "
                     f"llama-server (SmolLM2-135M)", fontsize=10)
    return OUT_DIR / f"{name}.png"


if __name__ == "__main__":
    main()
