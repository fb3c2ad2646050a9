"""Mixture-of-experts decoding on the portable backend against llama.cpp, at the speed of the experts it routes to.

Two random-weight shapes (bench/_moe_inputs.py), fewer layers than released (``--layers``) so that both sides fit
this machine at once: Qwen3-30B-A3B (all 128 experts, top 8, bfloat16, per-expert layout) and gpt-oss-20b (32
experts, top 4, its experts in MXFP4 as released; bfloat16 compute). llama.cpp gets the same checkpoint converted by
its own ``convert_hf_to_gguf.py`` (BF16; gpt-oss's experts stay MXFP4: ggml's MXFP4 has the same 4.25 bits).

Two measurements per shape, at each thread count (``--threads``):

* the routed-experts kernel alone (``torch.ops.neuronpack.routed_experts``, one token, top k of a layer's experts,
  a fresh draw of experts each call over ``--kernel-layers`` layers' worth so nothing is cached): its time against
  the read bound of the bytes of the k experts it must read (the streaming READ bandwidth, measured in the same run
  with the same threads over 1 GiB, bench/_common.py). Its share of that bound says whether it reads only the routed
  experts, and at what share of the bandwidth;
* the model end to end, batch 1, greedy, the same prompt token ids on both sides (SmolLM2's chat template, as
  bench/peers.py: a 41-token ``short`` prompt then ``--tokens`` new tokens, a ~500-token ``long`` one): time to first
  token, decode tokens/s, and the decode step's share of the read bound of the bytes a step reads (every weight but
  the embedding table, the experts at k / E: the active bytes), for our artifact (batch 1, prompts up to 512 tokens,
  1024 positions) and llama.cpp (llama-cpp-python in its own venv: bench/peers.py's worker), ``--rounds`` paired
  rounds, ratios as the median (min-max) of per-round ratios.

    .venv/bin/python -m bench.moe --llama-python /tmp/llamacpp-venv/bin/python --llama-src /tmp/llama.cpp \\
        --threads 1,2 --rounds 3

Output: a table on stdout, docs/bench/moe.json and moe.png.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from pathlib import Path

from bench._common import bench_parser, build_artifact, model_checkpoint, read_bandwidth_gbs, save_results
from bench._moe_inputs import SHAPES, artifact_sizes, gguf_sizes, moe_checkpoint, step_bytes
from bench.peers import MAX_CONTEXT, PROMPTS, SEQ_LEN, LlamaChild, check_llama, paired, run_neuronpack, summary

DEFAULT_LAYERS = {"qwen3-30b-a3b": 3, "gpt-oss-20b": 4}
MARKERS = {"ours": ".experts.", "gguf": "_exps."}  # expert tensors' names: the artifact's, llama.cpp's


def kernel_bench(shape: str, threads: int, layers: int, calls: int = 40) -> dict:
    """The routed-experts op alone on one token: median call time against the read bound of its k experts."""
    import torch

    from neuronpack.models import mxfp4
    from neuronpack.models.weight_arena import arena_copies

    cfg = SHAPES[shape]
    h = cfg["hidden_size"]
    i = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    e, k = cfg.get("num_experts") or cfg["num_local_experts"], cfg["num_experts_per_tok"]
    gen = torch.Generator().manual_seed(0)
    stacks = []
    for _ in range(layers):  # one layer's experts each: [E, 2I, H] and [E, H, I]
        gate_up = (torch.randn(e, 2 * i, h, generator=gen) * 0.02).bfloat16()
        down = (torch.randn(e, h, i, generator=gen) * 0.02).bfloat16()
        if shape == "gpt-oss-20b":
            (gate_up, gs), (down, ds) = mxfp4.quantize(gate_up), mxfp4.quantize(down)
            stacks.append(arena_copies([gate_up, down, gs, ds]))
        else:
            stacks.append(arena_copies([gate_up, down]) + [None, None])
        del gate_up, down
    per_expert = sum(t[0].numel() * t.element_size() for t in stacks[0] if t is not None)
    torch.set_num_threads(threads)
    bandwidth = read_bandwidth_gbs()
    x = torch.randn(1, h).bfloat16()
    weights = torch.full((1, k), 1.0 / k)
    activation = (1.702, 7.0, 1.0) if shape == "gpt-oss-20b" else (1.0, 0.0, 0.0)
    times = []
    for call in range(calls + 5):
        gu, dn, gs, ds = stacks[call % layers]
        ids = torch.randperm(e, generator=gen)[:k][None]
        start = time.perf_counter()
        torch.ops.neuronpack.routed_experts(x, ids, weights, gu, dn, gs, ds, None, None, *activation)
        if call >= 5:
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    active = per_expert * k
    del stacks
    gc.collect()
    return {"threads": threads, "experts_read_bytes": active, "call_ms": round(seconds * 1e3, 3),
            "gbs": round(active / seconds / 1e9, 1), "read_bandwidth_gbs": round(bandwidth, 1),
            "share_of_bound": round(active / seconds / 1e9 / bandwidth, 3)}


def end_to_end(shape: str, threads: int, artifact: Path, gguf: Path, prompts: dict, args) -> list[dict]:
    """Both sides loaded, ``args.rounds`` paired rounds of every prompt; one row per prompt."""
    import torch

    from neuronpack.backends.torch_aot import load_artifact

    torch.set_num_threads(threads)
    bandwidth = read_bandwidth_gbs()
    sides = {"llama": LlamaChild(args.llama_python, gguf, threads, prompts["short"]), "np": load_artifact(artifact)}
    run_neuronpack(sides["np"], prompts["short"], 4)  # warm-up
    runners = {"np": run_neuronpack, "llama": lambda child, prompt, n: child.run(prompt, n)}
    new = {"short": args.tokens, "long": 1}
    runs = {(side, name): [] for side in sides for name in prompts}
    try:
        for round_ in range(args.rounds):
            print(f"{shape}, {threads} thread(s): round {round_ + 1} of {args.rounds}", file=sys.stderr)
            for name, prompt in prompts.items():
                for side in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
                    runs[side, name].append(runners[side](sides[side], prompt, new[name]))
    finally:
        sides["llama"].close()
    cfg = SHAPES[shape]
    experts, per_token = cfg.get("num_experts") or cfg["num_local_experts"], cfg["num_experts_per_tok"]
    bytes_ = {"np": step_bytes(artifact_sizes(artifact), experts=experts, per_token=per_token,
                               expert_marker=MARKERS["ours"], embedding="model.embed_tokens.weight",
                               head="lm_head.weight"),
              "llama": step_bytes(gguf_sizes(gguf), experts=experts, per_token=per_token,
                                  expert_marker=MARKERS["gguf"], embedding="token_embd.weight", head="output.weight")}
    rows = []
    for name in prompts:
        sums = {side: summary(runs[side, name]) for side in sides}
        for side, s in sums.items():
            s["step_bytes"] = bytes_[side]
            if s.get("decode_tok_s"):
                s["decode_share_of_bound"] = round(s["decode_tok_s"] * bytes_[side]["active"] / (bandwidth * 1e9), 3)
        rows.append({"shape": shape, "threads": threads, "prompt": name, "prompt_tokens": len(prompts[name]),
                     "read_bandwidth_gbs": round(bandwidth, 1), "neuronpack": sums["np"], "llama_cpp": sums["llama"],
                     "same_tokens": sums["np"]["tokens"] == sums["llama"]["tokens"],
                     "np_ttft_vs_llama": paired(runs["np", name], runs["llama", name], "ttft_s"),
                     "np_decode_vs_llama": paired(runs["np", name], runs["llama", name], "decode_tok_s")})
    del sides
    gc.collect()
    return rows


def inputs(shape: str, args, tokenizer_dir: Path) -> tuple[Path, Path, Path]:
    """(checkpoint, our bfloat16 batch-1 artifact, llama.cpp's GGUF), made once in the workdir (the checkpoint may
    be deleted once both are made: it is written again only if one of them is missing)."""
    from bench._peers_inputs import make_ggufs

    layers = args.layers or DEFAULT_LAYERS[shape]
    checkpoint = args.workdir / f"{shape}-{layers}l"
    artifact_dir = args.workdir / f"artifact-{shape}-{layers}l"
    gguf = args.workdir / "gguf" / f"{checkpoint.name}-BF16.gguf"  # make_ggufs' name
    if (artifact_dir / "build-info.json").is_file() and gguf.is_file():
        return checkpoint, artifact_dir, gguf
    moe_checkpoint(shape, layers, tokenizer_dir, checkpoint)
    artifact = build_artifact(checkpoint, "bfloat16", artifact_dir, batch=1, seq_len=SEQ_LEN, max_context=MAX_CONTEXT)
    made = make_ggufs(checkpoint, args.llama_src, args.llama_python, args.workdir / "gguf", {"bf16"})["bf16"]
    return checkpoint, artifact, Path(made["path"])


def _ratio(r: dict | None) -> str:
    return f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})" if r else "-"


def print_table(report: dict) -> None:
    print(f"{report['machine_note']}; load {report['loadavg_before']} -> {report['loadavg_after']}")
    print(f"{'kernel alone':14} {'thr':>3} {'k experts MB':>12} {'ms':>7} {'GB/s':>6} {'bw GB/s':>7} {'of bound':>8}")
    for r in report["kernel"]:
        print(f"{r['shape']:14} {r['threads']:3} {r['experts_read_bytes'] / 1e6:12.1f} {r['call_ms']:7.2f} "
              f"{r['gbs']:6.1f} {r['read_bandwidth_gbs']:7.1f} {r['share_of_bound']:8.0%}")
    print(f"{'model':14} {'thr':>3} {'prompt':>9} {'active MB np/ll':>15} {'tok/s np':>8} {'tok/s ll':>8} "
          f"{'np/ll tok/s':>17} {'bound np/ll':>11} {'ttft np':>8} {'ttft ll':>8} {'np/ll ttft':>17} {'same':>4}")
    for r in report["results"]:
        np_, ll = r["neuronpack"], r["llama_cpp"]
        active = f"{np_['step_bytes']['active'] / 1e6:.0f}/{ll['step_bytes']['active'] / 1e6:.0f}"
        decode = r["prompt"] == "short"
        tok_s = f"{np_['decode_tok_s']:8.1f} {ll['decode_tok_s']:8.1f}" if decode else f"{'-':>8} {'-':>8}"
        share = f"{np_['decode_share_of_bound']:.2f}/{ll['decode_share_of_bound']:.2f}" if decode else "-"
        same = "yes" if r["same_tokens"] else "no"
        print(f"{r['shape']:14} {r['threads']:3} {r['prompt'] + ' ' + str(r['prompt_tokens']):>9} {active:>15} "
              f"{tok_s} {_ratio(r['np_decode_vs_llama']) if decode else '-':>17} {share:>11} "
              f"{np_['ttft_s'] * 1e3:6.0f}ms {ll['ttft_s'] * 1e3:6.0f}ms {_ratio(r['np_ttft_vs_llama']):>17} {same:>4}")


def plot(report: dict) -> None:
    from bench._common import figure, grouped_bars

    short = [r for r in report["results"] if r["prompt"] == "short"]
    groups = [f"{r['shape']}\n{r['threads']}t" for r in short]
    with figure("moe", figsize=(11, 4), ncols=2) as (_, (left, right)):
        grouped_bars(left, groups, {"neuronpack": [r["neuronpack"]["decode_tok_s"] for r in short],
                                    "llama.cpp": [r["llama_cpp"]["decode_tok_s"] for r in short]}, fmt="%.1f")
        left.set_ylabel("decode tokens/s, batch 1")
        left.set_title("decode after the short prompt")
        left.legend(fontsize=8)
        ttft = report["results"]
        grouped_bars(right, [f"{r['shape']}\n{r['prompt']} {r['threads']}t" for r in ttft],
                     {"neuronpack / llama.cpp": [r["np_ttft_vs_llama"]["median"] for r in ttft]}, fmt="%.2f",
                     fontsize=7)
        right.axhline(1.0, color="black", linewidth=0.8)
        right.set_ylabel("time to first token, ours / llama.cpp (lower is better)")
        right.tick_params(axis="x", labelsize=7)


def main() -> None:
    parser = bench_parser("moe", __doc__, model="smollm2", rounds=3)
    parser.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python")
    parser.add_argument("--llama-src", type=Path, required=True, help="llama.cpp's tree (convert_hf_to_gguf.py)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: by shape, "
                        + ", ".join(f"{s} {n}" for s, n in DEFAULT_LAYERS.items()) + ")")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens after the short prompt")
    parser.add_argument("--kernel-layers", type=int, default=2, help="layers' experts the kernel bench draws from")
    args = parser.parse_args()
    check_llama(args.llama_python)
    args.workdir.mkdir(parents=True, exist_ok=True)
    import torch
    import transformers

    from neuronpack.kernels import load_kernels

    load_kernels()  # this checkout's kernels serve the artifacts too
    tokenizer_dir = model_checkpoint(args)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    prompts = {name: list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                        return_dict=True)["input_ids"])
               for name, messages in PROMPTS.items()}
    load_before, kernel, results, files = os.getloadavg(), [], [], {}
    threads = [int(t) for t in args.threads.split(",")]
    for shape in args.shapes.split(","):
        checkpoint, artifact, gguf = inputs(shape, args, tokenizer_dir)
        files[shape] = {"checkpoint": str(checkpoint), "artifact": str(artifact), "gguf": str(gguf)}
        kernel += [{"shape": shape, **kernel_bench(shape, t, args.kernel_layers)} for t in threads]
        for t in threads:
            results += end_to_end(shape, t, artifact, gguf, prompts, args)
    report = {"shapes": {s: {"layers": args.layers or DEFAULT_LAYERS[s], **SHAPES[s]} for s in files},
              "files": files, "prompt_tokens": {n: len(p) for n, p in prompts.items()}, "new_tokens": args.tokens,
              "rounds": args.rounds, "torch": torch.__version__, "loadavg_before": load_before,
              "loadavg_after": os.getloadavg(), "kernel": kernel, "results": results,
              "machine_note": "a shared 2-core VM: the read bandwidth is measured in the same run and thread count "
                              "as each figure; ratios are medians of paired rounds",
              "active_bytes": "every weight but the embedding table, the experts at k / E (the routed share)",
              "precision": "bfloat16 compute; Qwen3-MoE's experts bfloat16 (llama.cpp BF16), gpt-oss's MXFP4 on "
                           "both sides"}
    save_results("moe", report)
    plot(report)
    print_table(report)


if __name__ == "__main__":
    main()
