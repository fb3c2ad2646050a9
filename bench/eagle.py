"""Benchmark: neuronpack convert-eagle vs the naive way (AWS's documented snippet), peak RSS and wall time.

Generates an untied bf16 Llama-like target (one model.safetensors of >= 1 GB: vocab 128256, hidden 2048) and an
EAGLE-1 fp16 draft (pytorch_model.bin with the original tensor names), then measures, each in its own subprocess:

- naive: load every draft tensor and the whole target shard holding lm_head.weight, cast the head to fp16, add it,
  save_file (AWS's snippet, generalised to a .bin draft);
- neuronpack (cold): ``convert_eagle`` with an empty digest cache (it also sha256-hashes the draft and the target
  shard for its manifest, in a background thread);
- neuronpack (warm): the same with the digest cache filled (the usual case after ``neuronpack compile``);
- copy: a plain copy of the output bytes (``shutil.copyfile``: kernel-side copy_file_range, bytes never reach user
  space);
- rw-copy: the same copy through user space (16 MiB read/write), the floor for a converter that touches the bytes.

Page cache is warmed before every run (inputs read once) so all runs see the same cache. Outputs of both converters
are compared tensor by tensor. Results: a table on stdout, docs/bench/eagle.json and docs/bench/eagle.png.

Usage: ``.venv/bin/python -m bench.eagle [--workdir DIR] [--rounds 2]``
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench._common import ROOT, bench_parser, figure, save_results, warm_page_cache

VOCAB, HIDDEN, INTERMEDIATE, HEADS, KV_HEADS = 128256, 2048, 8192, 32, 8


# --- inputs ---------------------------------------------------------------------------------------------------------
def make_inputs(work: Path) -> tuple[Path, Path]:
    """Write the target (bf16, >= 1 GB, one file) and the EAGLE-1 draft (fp16 .bin) once; reuse when present."""
    import torch
    from safetensors.torch import save_file

    target, draft = work / "target", work / "draft"
    torch.manual_seed(0)
    if not (target / "model.safetensors").is_file():
        target.mkdir(parents=True, exist_ok=True)
        tensors = {"model.embed_tokens.weight": _rand(VOCAB, HIDDEN, torch.bfloat16)}
        for i in range(2):
            tensors.update({f"model.layers.{i}.{k}": v for k, v in _layer(torch.bfloat16).items()})
            tensors[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        tensors["model.norm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        tensors["lm_head.weight"] = _rand(VOCAB, HIDDEN, torch.bfloat16)
        save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
        del tensors
        (target / "config.json").write_text(json.dumps(_config(num_layers=2, dtype="bfloat16", tie=False)))
    if not (draft / "pytorch_model.bin").is_file():
        draft.mkdir(parents=True, exist_ok=True)
        tensors = {"embed_tokens.weight": _rand(VOCAB, HIDDEN, torch.float16),
                   "fc.weight": _rand(HIDDEN, 2 * HIDDEN, torch.float16), "fc.bias": _rand(1, HIDDEN, torch.float16)[0]}
        tensors.update({f"layers.0.{k}": v for k, v in _layer(torch.float16).items()})
        torch.save(tensors, draft / "pytorch_model.bin")
        (draft / "config.json").write_text(json.dumps({**_config(num_layers=1, dtype="float16"), "bias": True}))
    return draft, target


def _rand(rows: int, cols: int, dtype):
    import torch

    return (torch.randn(rows, cols) * 0.02).to(dtype)


def _layer(dtype) -> dict:
    import torch

    head_dim = HIDDEN // HEADS
    shapes = {"self_attn.q_proj.weight": (HIDDEN, HIDDEN), "self_attn.k_proj.weight": (KV_HEADS * head_dim, HIDDEN),
              "self_attn.v_proj.weight": (KV_HEADS * head_dim, HIDDEN), "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
              "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN), "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
              "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE)}
    out = {name: _rand(*shape, dtype) for name, shape in shapes.items()}
    out["post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=dtype)
    return out


def _config(*, num_layers: int, dtype: str, tie: bool = False) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
            "num_hidden_layers": num_layers, "vocab_size": VOCAB, "torch_dtype": dtype,
            "tie_word_embeddings": tie, "rms_norm_eps": 1e-5, "rope_theta": 500000.0}


# --- the measured children ------------------------------------------------------------------------------------------
def child(mode: str, draft: Path, target: Path, out: Path) -> dict:
    """Run one mode in this process; return wall seconds of the work and RSS figures (MiB)."""
    import torch  # noqa: F401  (imported before the baseline so both modes pay it outside the measurement)

    if mode.startswith("neuronpack"):
        from neuronpack.convert.eagle import convert_eagle
    baseline = _maxrss_mib()
    sampler = _RssSampler()
    cpu_start = _cpu_s()
    start = time.perf_counter()
    if mode == "naive":
        naive_convert(draft, target, out)
    elif mode.startswith("neuronpack"):
        convert_eagle(draft, target, out)
    elif mode in ("copy", "rw-copy"):
        out.mkdir()
        for src in sorted(draft.iterdir()):  # here "draft" is the directory whose bytes are copied
            if src.name.endswith(".safetensors"):
                (shutil.copyfile if mode == "copy" else _read_write_copy)(src, out / src.name)
    wall = time.perf_counter() - start
    cpu = _cpu_s() - cpu_start
    sampler.stop()
    return {"mode": mode, "wall_s": wall, "cpu_s": cpu, "peak_rss_mib": _maxrss_mib(), "baseline_rss_mib": baseline,
            "peak_anon_mib": sampler.peak["RssAnon"], "peak_file_mib": sampler.peak["RssFile"]}


class _RssSampler:
    """Samples RssAnon (private memory) and RssFile (mapped file pages: page cache the kernel can reclaim) every
    10 ms, because peak RSS counts every touched page of an mmap-ed input until it is unmapped."""

    def __init__(self) -> None:
        import threading

        self.peak = {"RssAnon": 0.0, "RssFile": 0.0}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._sample()
            if self._done.wait(0.01):
                return

    def _sample(self) -> None:
        for line in Path("/proc/self/status").read_text().splitlines():
            key = line.split(":")[0]
            if key in self.peak:
                self.peak[key] = max(self.peak[key], int(line.split()[1]) / 1024)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        self._sample()


def _read_write_copy(src: Path, dst: Path) -> None:
    """A copy through user space (16 MiB read/write): what any converter that touches the bytes must at least pay.
    shutil.copyfile uses copy_file_range/sendfile and never brings the bytes into the process."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(16 * 2**20):
            fout.write(chunk)


def naive_convert(draft: Path, target: Path, out: Path) -> None:
    """AWS's documented approach: everything in memory, one save."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = torch.load(draft / "pytorch_model.bin", weights_only=True)
    index = target / "model.safetensors.index.json"
    shard = json.loads(index.read_text())["weight_map"]["lm_head.weight"] if index.is_file() else "model.safetensors"
    target_tensors = load_file(str(target / shard))
    tensors["lm_head.weight"] = target_tensors["lm_head.weight"].to(torch.float16)
    del target_tensors
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(draft / "config.json", out / "config.json")


def _cpu_s() -> float:
    """user + system CPU seconds of this process, all threads: less sensitive to a busy machine than wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _maxrss_mib() -> float:
    """Peak resident set of this process (VmHWM; ru_maxrss would carry the parent's peak across fork/exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(mode: str, draft: Path, target: Path, out: Path, cache_dir: Path) -> dict:
    warm_page_cache([draft, target])
    # Flush the previous run's dirty pages first: otherwise the next writer is throttled by the kernel while they
    # drain, and whichever mode runs second looks slow.
    os.sync()
    env = {**os.environ, "NEURONPACK_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bench.eagle", "--child", mode, str(draft), str(target), str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def outputs_match(a: Path, b: Path) -> bool:
    """Every tensor of the naive output equals the neuronpack output (names, dtypes, values)."""
    import torch
    from safetensors import safe_open

    with safe_open(str(a / "model.safetensors"), "pt") as fa, safe_open(str(b / "model.safetensors"), "pt") as fb:
        if set(fa.keys()) != set(fb.keys()):
            return False
        return all(torch.equal(fa.get_tensor(k), fb.get_tensor(k)) for k in fa.keys())


# --- driver ---------------------------------------------------------------------------------------------------------
def main() -> None:
    args = bench_parser("eagle", __doc__, rounds=2).parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    draft, target = make_inputs(work)
    sizes = {"draft_bytes": _size(draft, ".bin"), "target_bytes": _size(target, ".safetensors"),
             "head_bytes": VOCAB * HIDDEN * 2}
    modes = ("naive", "neuronpack-cold", "neuronpack-warm", "copy", "rw-copy")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for rep in range(args.rounds):
        outs = {m: work / f"out-{m}-{rep}" for m in runs}
        for path in outs.values():
            shutil.rmtree(path, ignore_errors=True)
        cache = work / f"digest-cache-{rep}"
        shutil.rmtree(cache, ignore_errors=True)
        # cold must precede warm (it fills the digest cache); naive alternates before/after them across repeats.
        order = ["naive", "neuronpack-cold", "neuronpack-warm"]
        for mode in order if rep % 2 == 0 else order[1:] + order[:1]:
            runs[mode].append(run_child(mode, draft, target, outs[mode], cache))
        for mode in ("copy", "rw-copy"):
            runs[mode].append(run_child(mode, outs["neuronpack-warm"], target, outs[mode], cache))
        if rep == 0:
            sizes["output_bytes"] = _size(outs["neuronpack-warm"], ".safetensors")
            sizes["outputs_identical"] = outputs_match(outs["naive"], outs["neuronpack-warm"])
        for m in modes:
            shutil.rmtree(outs[m], ignore_errors=True)
    report = summarize(runs, sizes)
    print_table(report)
    save(report)


def summarize(runs: dict[str, list[dict]], sizes: dict) -> dict:
    copy_wall = min(r["wall_s"] for r in runs["copy"])
    copy_median = statistics.median(r["wall_s"] for r in runs["copy"])
    budget_mib = (sizes["draft_bytes"] + sizes["head_bytes"]) / 2**20 + 150
    rows = []
    for mode, results in runs.items():
        wall = min(r["wall_s"] for r in results)
        peak = max(r["peak_rss_mib"] for r in results)
        base = min(r["baseline_rss_mib"] for r in results)
        median = statistics.median(r["wall_s"] for r in results)
        rows.append({"mode": mode, "wall_s": round(wall, 3), "wall_vs_copy": round(wall / copy_wall, 2),
                     "median_wall_s": round(median, 3), "median_vs_copy": round(median / copy_median, 2),
                     "median_cpu_s": round(statistics.median(r["cpu_s"] for r in results), 3),
                     "peak_rss_mib": round(peak, 1), "baseline_rss_mib": round(base, 1),
                     "above_baseline_mib": round(peak - base, 1),
                     "peak_anon_mib": round(max(r["peak_anon_mib"] for r in results), 1),
                     "peak_file_mib": round(max(r["peak_file_mib"] for r in results), 1), "runs": results})
    return {"machine": {"cpus": os.cpu_count(), "note": "2 shared cores, ~7 other engineers running builds/tests: "
                        "absolute times are noisy, compare ratios"},
            "sizes": sizes, "rss_budget_mib": round(budget_mib, 1), "rows": rows}


def print_table(report: dict) -> None:
    s = report["sizes"]
    print(f"target {s['target_bytes'] / 2**20:.0f} MiB, draft {s['draft_bytes'] / 2**20:.0f} MiB, head "
          f"{s['head_bytes'] / 2**20:.0f} MiB, output {s['output_bytes'] / 2**20:.0f} MiB, outputs identical: "
          f"{s['outputs_identical']}; RSS budget (draft + head + 150 MB) {report['rss_budget_mib']:.0f} MiB")
    print(f"{'mode':<18}{'best s':>9}{'x copy':>9}{'median s':>10}{'x copy':>9}{'CPU s':>8}{'peak RSS MiB':>14}"
          f"{'baseline MiB':>14}{'above base':>12}{'anon MiB':>10}{'file MiB':>10}")
    for r in report["rows"]:
        print(f"{r['mode']:<18}{r['wall_s']:>9.2f}{r['wall_vs_copy']:>9.2f}{r['median_wall_s']:>10.2f}"
              f"{r['median_vs_copy']:>9.2f}{r['median_cpu_s']:>8.2f}{r['peak_rss_mib']:>14.0f}"
              f"{r['baseline_rss_mib']:>14.0f}{r['above_baseline_mib']:>12.0f}{r['peak_anon_mib']:>10.0f}"
              f"{r['peak_file_mib']:>10.0f}")


def save(report: dict) -> None:
    save_results("eagle", report)
    rows = report["rows"]
    names = [r["mode"] for r in rows]
    with figure("eagle", figsize=(10, 4), ncols=2, dpi=100) as (fig, (ax_t, ax_m)):
        ax_t.bar(names, [r["median_wall_s"] for r in rows], color="tab:cyan", label="median")
        ax_t.bar(names, [r["wall_s"] for r in rows], color="tab:blue", label="best")
        ax_t.set_ylabel("wall time (s)")
        ax_t.legend(fontsize=8)
        ax_m.bar(names, [r["peak_rss_mib"] for r in rows], color="tab:orange", label="peak RSS")
        ax_m.bar(names, [r["peak_anon_mib"] for r in rows], color="tab:green", alpha=0.7, label="peak anonymous")
        ax_m.bar(names, [r["baseline_rss_mib"] for r in rows], color="tab:gray", label="after imports")
        ax_m.axhline(report["rss_budget_mib"], color="red", linestyle="--", label="draft + head + 150 MB")
        ax_m.set_ylabel("MiB")
        ax_m.legend(fontsize=8)
        for ax in (ax_t, ax_m):
            ax.tick_params(axis="x", labelrotation=20, labelsize=8)
        fig.suptitle("convert-eagle on a 1.2 GB bf16 target, fp16 EAGLE-1 draft (2 shared, busy cores)")


def _size(directory: Path, suffix: str) -> int:
    return sum(f.stat().st_size for f in directory.iterdir() if f.name.endswith(suffix))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        mode, draft_dir, target_dir, out_dir = sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5])
        print(json.dumps(child(mode, draft_dir, target_dir, out_dir)))
    else:
        main()
