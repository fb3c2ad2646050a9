"""Time to first token with and without prefix caching: a repeated ~400-token chat prompt prefilled whole (cache off)
against the same prompt with its prefix cached, a prompt sharing the same ~390-token system prompt with another
question (its prefix in the row the request takes, or copied in from a cache row beyond the batch), and (chunked
prefill) a ~1,000-token prompt, longer than the artifact's largest context bucket.

SmolLM2-135M-Instruct's demo artifact (recipes/smollm2-135m-cpu.toml: float32, batch 4, context buckets [128, 512],
seq_len 1024; ``--artifact`` to pass one, else it is compiled under ``--workdir``) in one process, the engine stepped in
this thread (no HTTP, no client), one token generated per request (``timings["ttft_s"]``: submit to first token).
Paired rounds: every round runs each case once, the order rotating; a cached case starts from an empty prefix cache,
runs its warming prompt (untimed) on the same engine, then the timed one. Figures: median, min, max and the quartiles
over ``--rounds``. Output: a table on stdout, docs/bench/prefix_cache.json and .png.

    .venv/bin/python -m bench.prefix_cache [--model .demo/SmolLM2-135M-Instruct] [--threads 1] [--rounds 9]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from bench._common import ROOT, bench_parser, figure, model_checkpoint, save_results
from bench._shared_prefix import QUESTIONS, grow_system


def compile_demo(model: Path, work: Path) -> Path:
    """The demo artifact of ``model`` (compiled under ``work`` unless it is there already): its directory."""
    argv = [sys.executable, "-m", "neuronpack", "compile", str(model), "--recipe",
            str(ROOT / "recipes" / "smollm2-135m-cpu.toml"), "--out-root", str(work), "--progress", "none"]
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return Path(done.stdout.strip().splitlines()[-1])


def chat_ids(tokenizer, system: str, question: str) -> list[int]:
    return list(tokenizer.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": question}]))


def prompts(tokenizer, target: int) -> dict[str, list[int]]:
    """The system prompt repeated (then cut by words) until a chat prompt has about ``target`` tokens; the two
    questions; a long one of about 1,000 tokens (the demo artifact takes up to 1023)."""
    def prompt_tokens(system: str) -> int:
        return len(chat_ids(tokenizer, system, QUESTIONS[0]))

    system, long_system = grow_system(prompt_tokens, target), grow_system(prompt_tokens, 1000)
    return {"first": chat_ids(tokenizer, system, QUESTIONS[0]), "second": chat_ids(tokenizer, system, QUESTIONS[1]),
            "long": chat_ids(tokenizer, long_system, QUESTIONS[0])}


def ttft(engine, ids: list[int]) -> float:
    from neuronpack.runtime.engine.requests import GenerationRequest
    from neuronpack.runtime.engine.sampling import SamplingParams

    request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=1, sampling=SamplingParams(temperature=0.0))
    return engine.generate(request).timings["ttft_s"]


def run_together(engine, prompts: list[list[int]]) -> dict[str, list[int]]:
    """Every prompt submitted at once (one token each), stepped until all finished."""
    from neuronpack.runtime.engine.requests import GenerationRequest
    from neuronpack.runtime.engine.sampling import SamplingParams

    outputs: dict[str, list[int]] = {}
    for ids in prompts:
        request = GenerationRequest(prompt_ids=tuple(ids), max_tokens=1, sampling=SamplingParams(temperature=0.0))
        outputs[request.request_id] = []
        engine.submit(request, lambda out, rid=request.request_id: outputs[rid].extend(out.token_ids))
    while engine.step():
        pass
    return outputs


def summary(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median_ms": statistics.median(values) * 1000, "min_ms": min(values) * 1000,
            "max_ms": max(values) * 1000, "q1_ms": q[0] * 1000, "q3_ms": q[2] * 1000,
            "rounds_ms": [v * 1000 for v in values]}


def plot(results: dict[str, dict], name: str, title: str) -> None:
    names = list(results)
    medians = [results[n]["median_ms"] for n in names]
    low = [m - results[n]["min_ms"] for n, m in zip(names, medians, strict=True)]
    high = [results[n]["max_ms"] - m for n, m in zip(names, medians, strict=True)]
    with figure(name, figsize=(9, 4.2)) as (_, ax):
        bars = ax.bar(range(len(names)), medians, yerr=[low, high], capsize=4, color="#4a7ab5")
        ax.bar_label(bars, fmt="%.0f", fontsize=8, padding=2)
        ax.set_yscale("log")
        ax.set_xticks(range(len(names)), [textwrap.fill(n, 24) for n in names], fontsize=8)
        ax.set_ylabel("first token, ms (log; median, bars: min-max)")
        ax.set_title(title, fontsize=9)


def main() -> None:
    parser = bench_parser("prefix_cache", __doc__, model="smollm2", rounds=9, threads=1, out=True)
    parser.add_argument("--artifact", type=Path, help="a compiled demo artifact (default: compile --model)")
    parser.add_argument("--tokens", type=int, default=400, help="about how long the repeated prompt is")
    args = parser.parse_args()
    from neuronpack.backends.torch_aot import load_artifact
    from neuronpack.runtime.engine import Engine
    from neuronpack.runtime.engine.prefix_cache import PrefixCaching
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    artifact = args.artifact or compile_demo(model_checkpoint(args), args.workdir)
    torch.set_num_threads(args.threads)
    lm = load_artifact(artifact)
    tokenizer = ArtifactTokenizer.from_dir(artifact)
    ids = prompts(tokenizer, args.tokens)
    off = Engine(lm, tokenizer, prefix_caching=PrefixCaching(enabled=False))
    on = Engine(lm, tokenizer)

    def cached(warm: list[int], timed: list[int], displace: bool = False) -> float:
        on.scheduler.rows.forget_cached()  # only what this case caches: not an earlier case's timed prompt
        ttft(on, warm)  # untimed: leaves the prompt's KV in a free row
        if displace:  # untimed: 4 short prompts take every batch row, so the prefix is saved into a cache row
            fillers = [chat_ids(tokenizer, "Be brief.", f"Question {i}?") for i in range(lm.batch_size)]
            outputs = run_together(on, fillers)
            assert len(outputs) == lm.batch_size
        return ttft(on, timed)

    shared = next((i for i, (a, b) in enumerate(zip(ids["first"], ids["second"], strict=False)) if a != b),
                  min(len(ids["first"]), len(ids["second"])))  # the tokens the two prompts start with
    cases = {
        f"cache off: {len(ids['first'])}-token prompt": lambda: ttft(off, ids["first"]),
        "cache on: the same prompt again": lambda: cached(ids["first"], ids["first"]),
        f"cache on: same system prompt, other question ({len(ids['second'])} tokens)":
            lambda: cached(ids["first"], ids["second"]),
        f"cache off: {len(ids['long'])}-token prompt (chunked)": lambda: ttft(off, ids["long"]),
        "cache on: other question, the prefix copied in from a cache row":
            lambda: cached(ids["first"], ids["second"], displace=True),
    }
    load_before = os.getloadavg()
    for case in cases.values():  # warm-up: every graph shape once
        case()
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(cases[name]())
    results = {name: summary(values) for name, values in times.items()}
    print(f"{'case':72} {'median ms':>10} {'min':>7} {'max':>7}")
    for name, res in results.items():
        print(f"{name:72} {res['median_ms']:10.1f} {res['min_ms']:7.1f} {res['max_ms']:7.1f}")
    text = on.metrics.render().decode()
    save_results(args.out, {"artifact": str(artifact), "threads": args.threads, "rounds": args.rounds,
                            "prompt_tokens": {k: len(v) for k, v in ids.items()}, "common_head_tokens": shared,
                            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                            "torch": torch.__version__, "results": results,
                            "metrics_prefix_cache": [line for line in text.splitlines()
                                                     if line.startswith("neuronpack_prefix_cache")]})
    plot(results, args.out,
         f"SmolLM2-135M float32, {args.threads} thread(s): first token, prefix cache off / on ({args.rounds} rounds)")


if __name__ == "__main__":
    main()
