"""A burst of prompts while a stream decodes: the engine's step token budget (``--max-num-batched-tokens``).

SmolLM2-135M-Instruct's batch-8 artifact (``--dtype``, default int8 with the head quantized too, as
bench/peers_serve.py serves it) in one process, the engine stepped in this thread (no HTTP, no client): one request
starts decoding, then 7 chat prompts arrive at once. The budgets of ``--budgets`` side by side (``EngineLimits.
max_num_batched_tokens``), ``--rounds`` rounds, the order rotating every round:

* ``default``: the automatic budget (step_budget.py: a chunk of about 2 measured decode steps);
* any number N (more than the batch): the decode step's tokens, then chunks of the waiting prompts in what is left
  (prompts x the longest chunk).

Figures per policy (medians over the rounds): the burst's time to first token (p50 and the last one), the longest gap
between two tokens of the running stream while the burst is admitted (what the budget bounds), and the time until
the burst's 7 requests and the stream have all finished (``--max-tokens`` each). Output: a table on stdout,
docs/bench/prefill_budget.json and .png.

    .venv/bin/python -m bench.prefill_budget [--model .demo/SmolLM2-135M-Instruct] [--threads 1] [--rounds 7]
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from bench._common import batch8_artifact, bench_parser, figure, grouped_bars, save_results


def burst(lm, tokenizer, prompts: list[list[int]], budget: int | None, max_tokens: int) -> dict:
    """One round: prompts[0] decodes alone for a few steps, then prompts[1:] arrive together."""
    from neuronpack.runtime.engine import Engine
    from neuronpack.runtime.engine.requests import EngineLimits, GenerationRequest

    engine = Engine(lm, tokenizer, limits=EngineLimits(max_num_batched_tokens=budget))
    times: dict[str, list[float]] = {}

    def sink(out) -> None:
        if out.token_ids:
            times.setdefault(out.request_id, []).append(time.perf_counter())

    def request(ids: list[int], name: str) -> GenerationRequest:
        return GenerationRequest(prompt_ids=tuple(ids), max_tokens=max_tokens, ignore_eos=True, request_id=name)

    engine.submit(request(prompts[0], "stream"), sink)
    while len(times.get("stream", ())) < 4:
        engine.step()
    arrived = time.perf_counter()
    for i, ids in enumerate(prompts[1:]):
        engine.submit(request(ids, f"burst{i}"), sink)
    while engine.step():
        pass
    done = max(t[-1] for t in times.values())
    first = sorted(times[f"burst{i}"][0] - arrived for i in range(len(prompts) - 1))
    admitted = max(times[f"burst{i}"][0] for i in range(len(prompts) - 1))
    # the stream's last token before the burst, then its tokens after: the gaps until the whole burst is admitted
    stream = [t for t in times["stream"] if t < arrived][-1:] + [t for t in times["stream"] if t >= arrived]
    gaps = [b - a for a, b in zip(stream[:-1], stream[1:], strict=True) if a <= admitted]
    return {"ttft_p50_ms": statistics.median(first) * 1000, "ttft_last_ms": first[-1] * 1000,
            "stream_max_gap_ms": max(gaps, default=0.0) * 1000, "all_done_s": done - arrived}


def plot(results: dict[str, dict], name: str, dtype: str) -> None:
    figures = {"burst TTFT p50": "ttft_p50_ms", "burst TTFT, last": "ttft_last_ms",
               "running stream's longest gap": "stream_max_gap_ms"}
    with figure(name, figsize=(8, 3.8)) as (_, ax):
        grouped_bars(ax, list(results), {label: [r[key] for r in results.values()] for label, key in figures.items()},
                     fmt="%.0f", fontsize=7)
        ax.set_ylabel("ms (median of rounds)")
        ax.set_title(f"7 chat prompts arriving while a stream decodes, SmolLM2 {dtype}, by prefill budget")
        ax.legend(fontsize=8)


def main() -> None:
    parser = bench_parser("prefill_budget", __doc__, model="smollm2", rounds=7, threads=1, out=True)
    parser.add_argument("--dtype", default="int8", choices=["float32", "bfloat16", "int8"])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--budgets", default="16,default,128,256", help="comma-separated: numbers or 'default'")
    args = parser.parse_args()
    from neuronpack.backends.torch_aot import load_artifact
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    artifact, prompts = batch8_artifact(args, args.dtype)
    torch.set_num_threads(args.threads)
    lm = load_artifact(artifact)
    tokenizer = ArtifactTokenizer.from_dir(artifact)
    policies = {f"budget {b}" if b != "default" else "automatic":
                None if b == "default" else int(b) for b in args.budgets.split(",")}
    load_before = os.getloadavg()
    rounds: dict[str, list[dict]] = {name: [] for name in policies}
    burst(lm, tokenizer, prompts, None, 8)  # warm-up
    names = list(policies)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rounds[name].append(burst(lm, tokenizer, prompts, policies[name], args.max_tokens))
    results = {name: {key: statistics.median(x[key] for x in runs) for key in runs[0]} | {"rounds": runs}
               for name, runs in rounds.items()}
    print(f"{'policy':14} {'TTFT p50 ms':>12} {'TTFT last ms':>12} {'stream max gap ms':>18} {'all done s':>10}")
    for name, res in results.items():
        print(f"{name:14} {res['ttft_p50_ms']:12.0f} {res['ttft_last_ms']:12.0f} {res['stream_max_gap_ms']:18.0f} "
              f"{res['all_done_s']:10.2f}")
    save_results(args.out, {"artifact": str(artifact), "dtype": args.dtype, "threads": args.threads,
                            "rounds": args.rounds, "max_tokens": args.max_tokens,
                            "prompt_tokens": [len(p) for p in prompts], "loadavg_before": load_before,
                            "loadavg_after": os.getloadavg(), "torch": torch.__version__, "results": results})
    plot(results, args.out, args.dtype)


if __name__ == "__main__":
    main()
