"""Benchmark: ``neuronpack quantize`` (streaming, row chunks) vs the in-memory way, input MB/s and peak RSS.

Generates a random bf16 Llama checkpoint of >= 1 GB once (hidden 2048, 12 layers, untied, two shards), then
measures, each in its own subprocess (peak RSS = the child's ru_maxrss; time measured inside the child, after
imports):

- in-memory reference: ``load_file`` every shard (the whole state dict), quantize each Linear weight as a whole
  matrix (fp32 copy, per-channel amax, round, int8), ``save_file`` everything into one file;
- neuronpack: ``quantize_checkpoint`` int8 per-channel, with an empty digest cache, so it also sha256-hashes every
  input file for its key and writes the report;
- neuronpack (warm digests): the same with the digest cache filled (the usual case inside ``neuronpack compile``).

The page cache is warmed (inputs read once) before every run. Both outputs are compared tensor by tensor. Each side
runs ``--repeat`` times alternately and the best time is kept (the machine is shared: compare ratios).
Decode speed of int8 vs fp32/bf16 artifacts is measured when the portable backend can load NxDI-format int8
weights (``neuronpack.backends.torch_aot``); otherwise the JSON says it is pending.

Usage: ``.venv/bin/python bench/quantize.py [--workdir DIR] [--repeat 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import save_results  # noqa: E402

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
                  "peak_anon": anon_peak[0]}))
"""

NEURONPACK = r"""
import json, resource, sys, time
from pathlib import Path
""" + ANON_PEAK + r"""
import torch  # imported up front so both sides pay the same interpreter + torch baseline
from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint
src, out = Path(sys.argv[1]), Path(sys.argv[2])
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t0 = time.perf_counter()
result = quantize_checkpoint(src, out, QuantizeOptions("int8", "per-channel"))
seconds = time.perf_counter() - t0
time.sleep(0.05)
print(json.dumps({"seconds": seconds, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "peak_anon": anon_peak[0], "baseline_rss": baseline, "snr_db": result.summary["snr_db"]}))
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
            "baseline_rss_mib": best.get("baseline_rss", 0) / 2**20 or None,
            "all_seconds": [round(r["seconds"], 2) for r in results],
        }
    return {"input_bytes": input_bytes, "tensors_compared": compared, "rows": rows,
            "output_bytes": sum(p.stat().st_size for p in (work / "out-np").glob("*.safetensors"))}


def decode_comparison() -> dict:
    """int8 vs fp32/bf16 decode tokens/s through the portable backend, when it supports NxDI int8 weights."""
    try:
        from neuronpack.backends.torch_aot import load_artifact  # noqa: F401
    except ImportError as exc:
        return {"status": "pending", "reason": f"neuronpack.backends.torch_aot.load_artifact unavailable ({exc})"}
    return {"status": "pending", "reason": "decode comparison not wired yet (see docs/quantize.md)"}


def print_table(result: dict) -> None:
    print(f"input {result['input_bytes'] / 2**30:.2f} GiB bf16 -> output {result['output_bytes'] / 2**30:.2f} GiB; "
          f"{result['tensors_compared']} tensors identical within one int8 step")
    print(f"{'method':28} {'seconds':>8} {'input MB/s':>11} {'peak RSS MiB':>13} {'peak anon MiB':>14}")
    for label, row in result["rows"].items():
        print(f"{label:28} {row['seconds']:8.2f} {row['input_mb_per_s']:11.0f} {row['peak_rss_mib']:13.0f} "
              f"{row['peak_anon_rss_mib']:14.0f}")
    ref, ours = result["rows"]["in-memory reference"], result["rows"]["neuronpack (warm digests)"]
    print(f"ratios (reference / neuronpack warm): time {ref['seconds'] / ours['seconds']:.2f}x, "
          f"peak RSS {ref['peak_rss_mib'] / ours['peak_rss_mib']:.2f}x, "
          f"peak anonymous RSS {ref['peak_anon_rss_mib'] / ours['peak_anon_rss_mib']:.2f}x")


def save_plot(result: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [label.replace(" (", "\n(") for label in result["rows"]]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (("input_mb_per_s", "input MB/s (higher is better)"),
              ("peak_anon_rss_mib", "peak anonymous RSS MiB (lower is better)"),
              ("peak_rss_mib", "peak RSS MiB incl. mmapped input pages"))
    for ax, (key, title) in zip(axes, panels, strict=True):
        bars = ax.bar(labels, [row[key] for row in result["rows"].values()], color=["#b55a4a", "#4a7ab5", "#4a9b6e"])
        ax.bar_label(bars, fmt="%.0f")
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"int8 per-channel quantization of a {result['input_bytes'] / 2**30:.2f} GiB bf16 Llama "
                 "(2 shared cores)")
    fig.tight_layout()
    path = ROOT / "docs" / "bench" / "quantize.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "neuronpack-bench-quantize")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    started, load_at_start = time.time(), os.getloadavg()
    result = measure(args.workdir, args.repeat)
    result["decode"] = decode_comparison()
    result["load_average"] = {"start": load_at_start, "end": os.getloadavg()}
    result["wall_seconds"] = round(time.time() - started, 1)
    print_table(result)
    print(f"decode comparison: {result['decode']}")
    print(f"saved {save_results('quantize', result)} and {save_plot(result)}")


if __name__ == "__main__":
    main()
