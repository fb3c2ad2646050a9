"""int8 decode steps over several rows: x rounded to int16 per row (kernels/int8_rows.cpp) against the float32
widening kernel it replaced, side by side in one process on one artifact.

SmolLM2-135M-Instruct's batch-8 int8 artifact (every linear int8, the tied head too: ``include_lm_head``, as
bench/peers_serve.py serves it), 2, 4 and 8 active rows decoding 8 different chat prompts together. For each row
count, ``--rounds`` paired rounds of ``--tokens`` decode steps alternate between the two kernels
(``torch.ops.neuronpack.set_dot_products``: on, the int16 rows; off, the widening kernel every earlier format ran
from 2 rows up; the order flips every round); figures: the median step per kernel and the median of the per-round
ratios with its spread (min-max). Also: how far the two kernels' logits are apart over the greedy run of the 8
prompts (largest absolute difference, and whether every greedy token is the same). One row is not compared: it
runs int8_row.cpp's kernel either way.

    .venv/bin/python -m bench.int8_rows [--model .demo/SmolLM2-135M-Instruct] [--threads 1] [--rounds 7]

Output: a table on stdout, docs/bench/int8_rows.json and .png (``--out`` names them).
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from bench._common import batch8_artifact, bench_parser, figure, grouped_bars, save_results

ROWS = (2, 4, 8)
KERNELS = ("int16 rows", "float32 widening")


def use(kernel: str) -> None:
    torch.ops.neuronpack.set_dot_products(kernel == KERNELS[0])


def greedy(lm, ids: list[list[int]], tokens: int) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Every row's logits per step and greedy tokens, all rows decoding together from their own positions."""
    slots = list(range(len(ids)))
    logits = [lm.prefill(slots, ids)]
    positions = torch.tensor([len(p) for p in ids])
    out = [logits[0].argmax(-1)]
    for i in range(tokens - 1):
        logits.append(lm.decode(out[-1], positions + i, slots=slots))
        out.append(logits[-1].argmax(-1))
    return logits[1:], torch.stack(out, 1).tolist()


def step_ms(lm, ids: list[list[int]], tokens: int) -> float:
    """Median wall ms of a decode step with len(ids) rows active (after a prefill and one warm-up step)."""
    slots = list(range(len(ids)))
    token = lm.prefill(slots, ids).argmax(-1)
    positions = torch.tensor([len(p) for p in ids])
    token = lm.decode(token, positions, slots=slots).argmax(-1)
    times = []
    for i in range(1, tokens):
        start = time.perf_counter()
        token = lm.decode(token, positions + i, slots=slots).argmax(-1)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def plot(rows: list[dict], name: str) -> None:
    with figure(name) as (_, ax):
        grouped_bars(ax, [f"{r['rows']} rows\n{r['speedup']:.2f}x" for r in rows],
                     {kernel: [r[kernel]["step_ms"] for r in rows] for kernel in KERNELS}, fmt="%.1f", width=0.76)
        ax.set_ylabel("decode step, ms (median)")
        ax.set_title("SmolLM2-135M int8 (head too): step by kernel of the int8 linears")
        ax.legend()


def main() -> None:
    parser = bench_parser("int8_rows", __doc__, model="smollm2", rounds=7, threads=1, out=True)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    from neuronpack.backends.torch_aot import load_artifact

    artifact, ids = batch8_artifact(args, "int8")
    torch.set_num_threads(args.threads)
    lm = load_artifact(artifact)
    load_before = os.getloadavg()
    agreement = {}
    with torch.inference_mode():
        runs = {}
        for kernel in KERNELS:
            use(kernel)
            runs[kernel] = greedy(lm, ids, args.tokens)
        (a_logits, a_tokens), (b_logits, b_tokens) = runs[KERNELS[0]], runs[KERNELS[1]]
        agreement = {"max_abs_logit_diff": max(float((a - b).abs().max()) for a, b in zip(a_logits, b_logits,
                                                                                          strict=True)),
                     "same_greedy_tokens": a_tokens == b_tokens,
                     "rows_with_same_tokens": sum(x == y for x, y in zip(a_tokens, b_tokens, strict=True))}
        results = []
        for rows in ROWS:
            samples = {k: [] for k in KERNELS}
            for r in range(args.rounds):
                for kernel in (KERNELS if r % 2 == 0 else KERNELS[::-1]):
                    use(kernel)
                    samples[kernel].append(step_ms(lm, ids[:rows], args.tokens))
            ratios = [b / a for a, b in zip(samples[KERNELS[0]], samples[KERNELS[1]], strict=True)]
            row = {"rows": rows, "speedup": statistics.median(ratios), "speedup_spread": [min(ratios), max(ratios)],
                   **{k: {"step_ms": statistics.median(v), "samples_ms": v} for k, v in samples.items()}}
            results.append(row)
            print(f"{rows} rows: int16 {row[KERNELS[0]]['step_ms']:.2f} ms, widening {row[KERNELS[1]]['step_ms']:.2f}"
                  f" ms: {row['speedup']:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
    use(KERNELS[0])
    report = {"artifact": str(artifact), "threads": args.threads, "rounds": args.rounds, "tokens": args.tokens,
              "torch": torch.__version__, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
              "agreement": agreement, "results": results}
    save_results(args.out, report)
    plot(results, args.out)
    print("\n| rows | int16 rows ms | float32 widening ms | speedup (spread) |\n|---|---|---|---|")
    for r in results:
        print(f"| {r['rows']} | {r[KERNELS[0]]['step_ms']:.2f} | {r[KERNELS[1]]['step_ms']:.2f} | "
              f"{r['speedup']:.2f}x ({r['speedup_spread'][0]:.2f}-{r['speedup_spread'][1]:.2f}) |")
    print(f"logits: largest difference {agreement['max_abs_logit_diff']:.4f}, greedy tokens equal in "
          f"{agreement['rows_with_same_tokens']} of {len(ids)} rows over {args.tokens} steps")


if __name__ == "__main__":
    main()
