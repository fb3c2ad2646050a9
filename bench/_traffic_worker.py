"""One side of bench/serving_traffic.py, run as a script in a fresh process whose PYTHONPATH names the neuronpack
code to measure (this checkout, or an older commit's ``git archive``): it uses only the engine API both have
(``Engine``, ``GenerationRequest``, ``PrefixCaching``, ``RowAllocator.lookup``) and prints one JSON object.

    PYTHONPATH=CODE python -P bench/_traffic_worker.py replay|stream|copies ARTIFACT --threads 1 [--budgets 0,64,512]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import numpy as np


def load(artifact: Path, threads: int):
    import torch

    from neuronpack.backends.torch_aot import load_artifact
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    torch.set_num_threads(threads)
    return load_artifact(artifact), ArtifactTokenizer.from_dir(artifact)


def request(ids, max_tokens: int, name: str | None = None):
    from neuronpack.runtime.engine import GenerationRequest
    from neuronpack.runtime.engine.sampling import SamplingParams

    extra = {"request_id": name} if name else {}
    return GenerationRequest(prompt_ids=tuple(ids), max_tokens=max_tokens, ignore_eos=True,
                             sampling=SamplingParams(temperature=0.0), **extra)


def replay(lm, tok, budgets: list[float], prefixes: int, length: int, repeats: int) -> dict:
    """``prefixes`` distinct ``length``-token prompts sent one at a time, then ``repeats`` requests drawn from them
    (seeded), each the prefix plus a question of its own: the repeats' prompt tokens served from the cache, and how
    many of the prefixes the cache held after the first pass, per budget."""
    from neuronpack.runtime.engine import Engine
    from neuronpack.runtime.engine.metrics import metric_value
    from neuronpack.runtime.engine.prefix_cache import PrefixCaching

    rng = random.Random(49)
    stems = [[rng.randrange(100, lm.vocab_size) for _ in range(length)] for _ in range(prefixes)]
    order = [rng.randrange(prefixes) for _ in range(repeats)]
    out = {}
    for budget in budgets:
        engine = Engine(lm, tok, prefix_caching=PrefixCaching(memory_mib=budget))
        for stem in stems:
            engine.generate(request([*stem, 1, 2, 3, 4], 8))
        held = sum(engine.scheduler.rows.lookup([*stem, 9, 9], 0) >= length - 16 for stem in stems)
        before = metric_value(engine.metrics.render().decode(), "neuronpack_prefix_cache_hits_total")
        queried = 0
        for i, k in enumerate(order):
            prompt = [*stems[k], 5 + i % 50, 6, 7, 8, 9]
            queried += len(prompt)
            engine.generate(request(prompt, 8))
        hits = metric_value(engine.metrics.render().decode(), "neuronpack_prefix_cache_hits_total") - before
        out[f"{budget:g}"] = {"hit_tokens": hits, "queried_tokens": queried, "prefixes_held": held}
    return out


def copies(lm, length: int, rounds: int = 5) -> dict:
    """What the row moves cost against the prefill they save, on the model's own cache (this checkout only): a
    ``length``-token prefix into the pool and back (``BlockCopy``), a swap of two rows of ``length`` positions
    (``RowSwap``, what packing does instead of dropping a prefix), a row copy, and prefilling ``length`` tokens."""
    from neuronpack.runtime.engine.kv_rows import BlockCopy, RowCopy, RowSwap

    blocks = length // 16
    lm.reserve_blocks(max(blocks, 1), 16)
    prompt = list(range(100, 100 + length))
    lm.prefill([0], [prompt[:512]])
    moves = {"to pool": [BlockCopy(0, tuple(range(blocks)), tuple(range(blocks)), True)],
             "from pool": [BlockCopy(1, tuple(range(blocks)), tuple(range(blocks)), False)],
             "row swap": [RowSwap(0, 1, length, length)], "row copy": [RowCopy(0, 1, length)]}
    out = {}
    for name, move in moves.items():
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            lm.move_kv(move)
            times.append(time.perf_counter() - started)
        out[f"{name}_ms"] = statistics.median(times) * 1000
    times = []
    for _ in range(max(2, rounds // 2)):
        started = time.perf_counter()
        for at in range(0, length, 512):
            lm.prefill([0], [prompt[at:at + 512]], starts=[at] if at else None)
        times.append(time.perf_counter() - started)
    out["prefill_ms"] = statistics.median(times) * 1000
    out["tokens"] = length
    return out


def stream(lm, tok, long_tokens: int, before_tokens: int, step_tokens: int | None = None) -> dict:
    """A stream decodes alone for ``before_tokens`` tokens, then a ``long_tokens``-token prompt arrives: the
    stream's gaps before it (the decode step), while it is prefilled (until its first token), and its TTFT."""
    from neuronpack.runtime.engine import Engine

    rng = random.Random(7)
    if step_tokens is None:
        engine = Engine(lm, tok)
    else:  # this checkout's step budget (--step-tokens)
        from neuronpack.runtime.engine.requests import EngineLimits

        engine = Engine(lm, tok, limits=EngineLimits(max_num_batched_tokens=step_tokens))
    times: dict[str, list[float]] = {"stream": [], "long": []}

    def sink_for(name):
        def sink(out):
            if out.token_ids:
                times[name].append(time.perf_counter())
        return sink

    engine.submit(request([rng.randrange(100, lm.vocab_size) for _ in range(24)], 400, "stream"),
                  sink_for("stream"))
    while len(times["stream"]) < before_tokens:
        engine.step()
    arrived = time.perf_counter()
    engine.submit(request([rng.randrange(100, lm.vocab_size) for _ in range(long_tokens)], 4, "long"),
                  sink_for("long"))
    while not times["long"]:
        engine.step()
    for _ in range(4):
        engine.step()
    first = times["long"][0]
    ticks = times["stream"]
    alone = [b - a for a, b in zip(ticks[1:before_tokens - 1], ticks[2:before_tokens], strict=True)]
    last_before = max(t for t in ticks if t < arrived)
    during = [t for t in ticks if t >= arrived and t <= first + 0.5]
    window = [last_before, *during]
    gaps = [b - a for a, b in zip(window[:-1], window[1:], strict=True)]
    return {"decode_step_ms": statistics.median(alone) * 1000, "gap_p99_ms": float(np.percentile(gaps, 99)) * 1000,
            "gap_max_ms": max(gaps) * 1000, "gaps": len(gaps), "ttft_long_ms": (first - arrived) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=("replay", "stream", "copies"))
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budgets", default="0,64,512,4096")
    parser.add_argument("--prefixes", type=int, default=6)
    parser.add_argument("--length", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--long", type=int, default=1000)
    parser.add_argument("--step-tokens", type=int, default=None, help="stream: the step budget (default: the engine's)")
    args = parser.parse_args()
    lm, tok = load(args.artifact, args.threads)
    if args.scenario == "replay":
        result = replay(lm, tok, [float(b) for b in args.budgets.split(",")], args.prefixes, args.length,
                        args.repeats)
    elif args.scenario == "copies":
        result = copies(lm, args.length)
    else:
        result = stream(lm, tok, args.long, 20, args.step_tokens)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
