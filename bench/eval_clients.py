"""Clients nobody here wrote, against ``neuronpack serve`` on SmolLM2-135M-Instruct fp32 (``make eval-clients``):

1. lm-evaluation-harness, model ``local-completions`` (token-id prompts, echo + logprobs) on the shipped
   multiple-choice task (tests/data/lm_eval: a task YAML over a JSONL file), against lm-eval's own ``hf`` model on
   the same checkpoint: accuracy must be equal and every per-choice loglikelihood within 1e-3;
2. guidellm with synthetic prompts at concurrency 1, 4 and 8 (artifact batch 8): it must run to completion without
   errors. Its report (per-request detail dropped) goes to docs/bench/guidellm.json, the comparison to
   docs/bench/lm_eval.json.

The artifact is compiled with bench/serve.py's recipe into the work directory on first use.

    .venv/bin/python -m bench.eval_clients [--threads 1] [--requests 8] [--prompt-tokens 64] [--output-tokens 32]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bench._common import bench_parser, free_port, model_checkpoint, save_results
from bench.serve import start_server, stop_server
from tests.helpers.eval_clients import hf_args, local_completions_args, run_guidellm, run_lm_eval

SERVED_NAME = "smollm2"  # what bench/serve.py's start_server serves the artifact as
STREAMS = (1, 4, 8)


def compare_lm_eval(url: str, model: Path, work: Path, limit: int | None) -> dict:
    served, reference = run_lm_eval([("local-completions", local_completions_args(url, SERVED_NAME, model,
                                                                                num_concurrent=4)),
                                     ("hf", hf_args(model))], work, limit=limit, batch_size=4)
    diffs = [abs(a - b) for ours, theirs in zip(served.loglikelihoods, reference.loglikelihoods, strict=True)
             for a, b in zip(ours, theirs, strict=True)]
    return {
        "documents": len(served.loglikelihoods),
        "choices_scored": len(diffs),
        "acc_served": served.acc,
        "acc_hf": reference.acc,
        "loglikelihood_max_abs_diff": max(diffs),
        "loglikelihood_mean_abs_diff": sum(diffs) / len(diffs),
        "is_greedy_equal": served.is_greedy == reference.is_greedy,
        "passed": served.acc == reference.acc and max(diffs) <= 1e-3,
    }


def run_load(url: str, model: Path, work: Path, args) -> list[dict]:
    full = work / "guidellm-full.json"
    rows = run_guidellm(url, SERVED_NAME, model, full, profile=f"kind=concurrent,streams={STREAMS[0]}",
                        overrides=(f"profile.streams {','.join(map(str, STREAMS))}",),
                        max_requests=args.requests, prompt_tokens=args.prompt_tokens,
                        output_tokens=args.output_tokens)
    report = json.loads(full.read_text())
    for bench in report["benchmarks"]:
        bench.pop("requests", None)  # per-request detail: megabytes, kept in the work directory only
    save_results("guidellm", report)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("eval_clients", __doc__, model="smollm2", threads=1)
    parser.add_argument("--limit", type=int, default=None, help="lm-eval documents (default: all 24)")
    parser.add_argument("--requests", type=int, default=8, help="guidellm requests per concurrency level")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    model = model_checkpoint(args)
    artifact = args.workdir / "eval-clients-artifact"  # compiled into on first use, served as-is afterwards
    port = free_port()
    load_before = os.getloadavg()
    print(f"starting the server on {artifact} (compiles on first use)", file=sys.stderr)
    proc, started = start_server(artifact, port, args.threads, model=None if artifact.is_dir() else model)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.perf_counter()
        lm_eval = compare_lm_eval(url, model, args.workdir, args.limit)
        lm_eval["seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(lm_eval, indent=1))
        rows = run_load(url, model, args.workdir, args)
    finally:
        stop_server(proc)
    load_after = os.getloadavg()
    save_results("lm_eval", {"model": model.name, "threads": args.threads, **lm_eval,
                             "loadavg_before": load_before, "loadavg_after": load_after})
    print(f"\n{'concurrency':>11} {'req/s':>7} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} "
          f"{'ok':>4} {'err':>4}")
    for r in rows:
        print(f"{r['max_concurrency']!s:>11} {r['requests_per_s']:7.2f} {r['output_tokens_per_s']:10.1f} "
              f"{r['ttft_ms_p50']:8.0f}ms {r['ttft_ms_p99']:8.0f}ms {r['itl_ms_p50']:6.0f}ms "
              f"{r['requests']['successful']:4d} {r['requests']['errored']:4d}")
    base = rows[0]["output_tokens_per_s"]
    print("output tokens/s vs concurrency 1: " + ", ".join(f"c={r['max_concurrency']}: "
                                                            f"{r['output_tokens_per_s'] / base:.2f}x" for r in rows))
    print(f"start-up {started:.1f} s; threads {args.threads}; load average {load_before[0]:.1f} -> "
          f"{load_after[0]:.1f} on {os.cpu_count()} cores")
    if not lm_eval["passed"] or any(r["requests"]["errored"] for r in rows):
        raise SystemExit("eval clients: FAILED (see above)")


if __name__ == "__main__":
    main()
