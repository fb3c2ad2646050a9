"""Serving under real traffic (issue 49), before and after in one run: the prefix cache's hits by budget, and a
running stream's gaps while a long prompt is prefilled.

The demo artifact (SmolLM2-135M-Instruct float32, batch 4, max model length 1024: ``--artifact``), the engine in
process, stepped on the process's thread (no HTTP). Each side runs in its own fresh process
(bench/_traffic_worker.py) on its own code: this checkout ("after") and ``--before-commit``'s ``git archive``
("before", default main), the sides alternating round by round (``--rounds``):

* **replay**: 6 distinct 600-token prompts sent one at a time (8 tokens each), then 12 requests drawn from them
  (seeded), each the prefix plus a question of its own, at prefix-cache budgets of 0 / 64 / 512 MiB and an
  unbounded one (4096 MiB: more than every prefix takes). Figures: the repeats' prompt tokens served from the cache
  (hits), as a share of the unbounded cache's; the prefixes held after the first pass, and per MiB of budget beyond
  what the batch's free rows hold (budget 0).
* **stream**: one stream decodes alone for 20 tokens, then a 1,000-token prompt arrives. Figures: the stream's
  median decode step alone, its p99 and longest gap from the arrival until the long prompt's first token (+0.5 s),
  and the long prompt's time to first token. Target: p99 gap <= 3x the median decode step.
* **copies** (after only): what moving a 600-token prefix's KV costs (into the block pool and back, a row swap, a
  row copy) against prefilling it, the work a hit saves.

Output: a table on stdout, docs/bench/serving_traffic.json and .png.

    .venv/bin/python -m bench.serving_traffic --artifact DIR [--before-commit main] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench._common import ROOT, bench_parser, figure, grouped_bars, old_code, save_results

WORKER = Path(__file__).resolve().parent / "_traffic_worker.py"
BUDGETS = (0, 64, 512, 4096)  # MiB; 4096: unbounded (every prefix fits)


def run_side(code: Path, scenario: str, artifact: Path, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run([sys.executable, "-P", str(WORKER), scenario, str(artifact), "--threads", str(threads),
                           "--budgets", ",".join(map(str, BUDGETS))], env=env, check=True, capture_output=True,
                          text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict]) -> dict:
    """Medians over rounds of every number in the runs (same keys, nested one level at most)."""
    first = runs[0]
    if all(not isinstance(v, dict) for v in first.values()):
        return {k: statistics.median(r[k] for r in runs) for k in first}
    return {k: summarize([r[k] for r in runs]) for k in first}


def main() -> None:
    parser = bench_parser("serving_traffic", __doc__, rounds=3, threads=1, out=True)
    parser.add_argument("--artifact", type=Path, required=True, help="the demo artifact (smollm2-135m-cpu recipe)")
    parser.add_argument("--before-commit", default="main")
    parser.add_argument("--scenarios", default="stream,replay", help="which to run (default: %(default)s)")
    args = parser.parse_args()
    scenarios = args.scenarios.split(",")
    args.workdir.mkdir(parents=True, exist_ok=True)
    sides = {"before": old_code(args.before_commit, args.workdir), "after": ROOT}
    runs: dict[str, dict[str, list[dict]]] = {s: {sc: [] for sc in scenarios} for s in sides}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for scenario in scenarios:
            for side in order:
                runs[side][scenario].append(run_side(sides[side], scenario, args.artifact, args.threads))
                print(f"round {r + 1} {scenario} {side}: {runs[side][scenario][-1]}", file=sys.stderr)
    results = {side: {sc: summarize(rs) for sc, rs in by.items()} for side, by in runs.items()}
    moves = run_side(ROOT, "copies", args.artifact, args.threads)
    print("a 600-token prefix's KV moved (ms): " + ", ".join(f"{k[:-3]} {v:.1f}" for k, v in moves.items()
                                                              if k.endswith("_ms")) + " (prefill: the work saved)")
    if "replay" in scenarios:
        print_replay(results)
    if "stream" in scenarios:
        print_stream(results)
    save_results(args.out, {"artifact": str(args.artifact), "threads": args.threads, "rounds": args.rounds,
                            "before_commit": args.before_commit, "budgets_mib": list(BUDGETS),
                            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                            "kv_moves_600_tokens": moves, "results": results, "runs": runs})
    if scenarios == ["stream", "replay"]:
        plot(results, list(sides), args.out)


def print_replay(results: dict) -> None:
    print(f"{'':8} {'budget MiB':>10} {'hit tokens':>10} {'of unbounded':>12} {'prefixes held':>13} {'per MiB':>8}")
    for side, res in results.items():
        replay = res["replay"]
        unbounded = replay[f"{BUDGETS[-1]}"]["hit_tokens"] or 1
        base = replay["0"]["prefixes_held"]
        for b in BUDGETS:
            row = replay[f"{b}"]
            row["share_of_unbounded"] = row["hit_tokens"] / unbounded
            row["held_per_mib"] = (row["prefixes_held"] - base) / b if b else None
            per = "" if row["held_per_mib"] is None else f"{row['held_per_mib']:.3f}"
            print(f"{side:8} {b:10} {row['hit_tokens']:10.0f} {row['share_of_unbounded']:12.0%} "
                  f"{row['prefixes_held']:13.0f} {per:>8}")


def print_stream(results: dict) -> None:
    print(f"\n{'':8} {'decode step ms':>14} {'gap p99 ms':>10} {'gap max ms':>10} {'p99 / step':>10} "
          f"{'long TTFT ms':>12}")
    for side, res in results.items():
        s = res["stream"]
        s["p99_over_step"] = s["gap_p99_ms"] / s["decode_step_ms"]
        print(f"{side:8} {s['decode_step_ms']:14.1f} {s['gap_p99_ms']:10.0f} {s['gap_max_ms']:10.0f} "
              f"{s['p99_over_step']:10.1f} {s['ttft_long_ms']:12.0f}")
    ttft = results["after"]["stream"]["ttft_long_ms"] / results["before"]["stream"]["ttft_long_ms"]
    results["ttft_long_after_over_before"] = ttft
    print(f"\nlong prompt TTFT after / before: {ttft:.2f}x")


def plot(results: dict, sides: list[str], name: str) -> None:
    with figure(name, figsize=(9, 3.6), ncols=2) as (_, axes):
        grouped_bars(axes[0], [f"{b} MiB" if b < BUDGETS[-1] else "unbounded" for b in BUDGETS],
                     {side: [results[side]["replay"][f"{b}"]["hit_tokens"] for b in BUDGETS] for side in sides},
                     fmt="%.0f", fontsize=7)
        axes[0].set_ylabel("repeats' prompt tokens hit")
        axes[0].set_title("one-at-a-time replay, by budget", fontsize=9)
        axes[0].legend(fontsize=8)
        keys = {"decode step": "decode_step_ms", "gap p99": "gap_p99_ms", "long TTFT / 10": "ttft_long_ms"}
        grouped_bars(axes[1], list(keys), {side: [results[side]["stream"][k] / (10 if "TTFT" in label else 1)
                                                  for label, k in keys.items()] for side in sides},
                     fmt="%.0f", fontsize=7)
        axes[1].set_ylabel("ms (median of rounds)")
        axes[1].set_title("a stream while a 1,000-token prompt arrives", fontsize=9)
        axes[1].legend(fontsize=8)


if __name__ == "__main__":
    main()
