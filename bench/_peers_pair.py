"""Two of bench/peers.py's batch-1 artifacts of one model in one process, their prefills alternated round by round
(the same load on both): the ratio of their times to first token, and their decode step after the short prompt.
bench/peers.py loads one precision at a time, so it cannot pair two of ours; docs/portable-backend.md ("A model past
135M") and docs/quantize.md cite the runs (docs/bench/history/peers-large-pair-*.json).

    .venv/bin/python -m bench._peers_pair OUT.json ROUNDS WORKDIR int8-bf16,bfloat16 [THREADS]

WORKDIR is bench/peers.py's (its artifact-<precision>-b1-512 directories and SmolLM2-1.7B-random's tokenizer). Run it
with PYTHONPATH=<an older checkout> for that code's kernels.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

from bench.peers import PROMPTS
from neuronpack.backends.torch_aot import load_artifact
from neuronpack.kernels import load_kernels


def main() -> None:
    out, rounds, workdir, precisions = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4].split(",")
    torch.set_num_threads(int(sys.argv[5]) if len(sys.argv) > 5 else 1)
    load_kernels()  # this code's kernels serve both artifacts
    tokenizer = transformers.AutoTokenizer.from_pretrained(workdir / "SmolLM2-1.7B-random")
    prompts = {n: list(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"]) for n, m in PROMPTS.items()}
    lms = {p: load_artifact(workdir / f"artifact-{p}-b1-512") for p in precisions}
    for lm in lms.values():
        lm.prefill([0], [prompts["short"]])  # warm-up
    times = {(p, n): [] for p in lms for n in prompts}
    first, decode_ms = {}, {p: [] for p in lms}
    for r in range(rounds):
        for n, ids in prompts.items():
            for p in list(lms) if r % 2 == 0 else list(lms)[::-1]:
                start = time.perf_counter()
                token = lms[p].prefill([0], [ids]).argmax(-1)
                times[p, n].append(time.perf_counter() - start)
                first[f"{p} {n}"] = int(token)
                if n == "short":  # 16 decode steps
                    start = time.perf_counter()
                    for i in range(16):
                        token = lms[p].decode(token, torch.tensor([len(ids) + i]), slots=[0]).argmax(-1)
                    decode_ms[p].append((time.perf_counter() - start) / 16 * 1000)
        print(f"round {r + 1} of {rounds}", file=sys.stderr, flush=True)
    a, b = precisions
    report = {"loadavg": list(os.getloadavg()), "first_token": first, "decode_ms": decode_ms,
              "prefill_s": {f"{p} {n}": v for (p, n), v in times.items()},
              "ratio_first_over_second": {n: sorted(x / y for x, y in zip(times[a, n], times[b, n], strict=True))
                                          for n in prompts}}
    out.write_text(json.dumps(report, indent=1))
    print({n: round(statistics.median(v), 3) for n, v in report["ratio_first_over_second"].items()})


if __name__ == "__main__":
    main()
