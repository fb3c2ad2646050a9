"""`neuronpack convert-eagle` wall time vs copying its output (`cp -r`), for a small and a realistically sized draft.

Small: the target is SmolLM2-135M-Instruct (fp32, tied embeddings: its head is model.embed_tokens.weight) and the
bench generates two EAGLE-1 drafts of that size (embed_tokens [49152, 576], fc [576, 1152] + bias, one decoder layer):

- ``same-dtype``: an fp32 safetensors draft: every output byte is a copy of an input byte (draft tensors and the
  target's head rows);
- ``cast``: a bf16 safetensors draft: the target's fp32 head is cast to bf16 on the way.

At 120-240 MB of output these are far smaller than the EAGLE drafts of real models (EAGLE-LLaMA3-Instruct-8B is
~1.5 GB before the 1 GB head is added), so the fixed cost of starting the CLI weighs much more than it does for a
user. With ``--realistic`` two drafts shaped for a Llama-3.2-1B-class target (vocab 128256, hidden 2048, one decoder
layer of intermediate 8192, ~1.1 GB of output) are measured too:

- ``1b-same-dtype``: a bf16 draft for a bf16 target (the usual case: every output byte is copied);
- ``1b-cast``: an fp16 draft for a bf16 target (as EAGLE-LLaMA3 drafts are fp16 and Llama 3 is bf16): the head is
  cast bf16 -> fp16.

Their target is a checkpoint holding only the 128256 x 2048 bf16 ``lm_head.weight`` (and the config of a
Llama-3.2-1B-class model): convert-eagle reads nothing else of a target, so the other weights would only take disk.

Each conversion runs the CLI in a fresh process, as a user would: ``neuronpack convert-eagle --draft D --target T
--out O --quiet``, with the digest cache warm (the run before filled it; the first, cold run also hashes the draft
and the target's weight file for the provenance manifest and is reported apart). ``copy`` is ``cp -r`` of the
converted directory; ``cp+sync`` also fsyncs the copied files, as convert-eagle does before it renames its output
into place. Dirty pages are flushed (``sync``) before every run. With ``--before-commit REV`` (a ``git archive`` of
that code, see ``_common.unpack``) the same runs are made with that code, interleaved round by round with this
checkout's (a busy machine slows both alike), and its outputs are compared byte for byte with this checkout's.

    .venv/bin/python -m bench.convert_eagle [--model DIR] [--before-commit main] [--rounds 5] [--bytecode cached]
        [--realistic]

Target: convert-eagle wall <= 2x copying its output. Output: table, docs/bench/convert_eagle.json + .png.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from bench._common import (
    OUT_DIR,
    bench_parser,
    bytecode_env,
    figure,
    model_checkpoint,
    neuronpack_argv,
    old_code,
    run_timed,
    save_results,
    warm_page_cache,
)

DRAFTS = {"same-dtype": "float32", "cast": "bfloat16"}  # drafts for SmolLM2-135M (fp32)
REALISTIC_DRAFTS = {"1b-same-dtype": "bfloat16", "1b-cast": "float16"}  # drafts for the bf16 1B-class target
# A Llama-3.2-1B-class model: the shapes an EAGLE draft for it has (its head is what convert-eagle adds)
REALISTIC_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
                    "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 16, "rms_norm_eps": 1e-5,
                    "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": False,
                    "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128009}


def make_head_only_target(out: Path) -> Path:
    """The 1B-class target as convert-eagle sees it: config.json and a bf16 lm_head.weight; reused when present."""
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(1)
    head = torch.empty(REALISTIC_CONFIG["vocab_size"], REALISTIC_CONFIG["hidden_size"], dtype=torch.bfloat16)
    head.normal_(0.0, 0.02, generator=gen)
    out.mkdir(parents=True)
    save_file({"lm_head.weight": head}, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(REALISTIC_CONFIG, indent=2))
    return out


def make_draft(target: Path, out: Path, dtype: str) -> Path:
    """An EAGLE-1 draft sized for ``target`` (random weights, safetensors, ``dtype``); reused when present."""
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from safetensors.torch import save_file

    config = json.loads((target / "config.json").read_text())
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * config.get("head_dim", hidden // config["num_attention_heads"])
    shapes = {"embed_tokens.weight": (vocab, hidden), "fc.weight": (hidden, 2 * hidden), "fc.bias": (hidden,),
              "layers.0.self_attn.q_proj.weight": (hidden, hidden), "layers.0.self_attn.k_proj.weight": (kv, hidden),
              "layers.0.self_attn.v_proj.weight": (kv, hidden), "layers.0.self_attn.o_proj.weight": (hidden, hidden),
              "layers.0.mlp.gate_proj.weight": (inter, hidden), "layers.0.mlp.up_proj.weight": (inter, hidden),
              "layers.0.mlp.down_proj.weight": (hidden, inter), "layers.0.post_attention_layernorm.weight": (hidden,)}
    gen = torch.Generator().manual_seed(0)
    tensors = {name: torch.empty(shape, dtype=getattr(torch, dtype)).normal_(0.0, 0.02, generator=gen)
               for name, shape in shapes.items()}
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    draft_config = {**config, "num_hidden_layers": 1, "bias": True, "torch_dtype": dtype,
                    "architectures": ["LlamaForCausalLM"]}
    draft_config.pop("dtype", None)
    (out / "config.json").write_text(json.dumps(draft_config, indent=2))
    return out


def tree_digest(directory: Path) -> dict[str, str]:
    """sha256 of every file of a converted draft (the provenance manifest included: it names only the inputs)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def convert(code: Path | None, draft: Path, target: Path, out: Path, env: dict) -> tuple[float, float]:
    argv, extra = neuronpack_argv(code)
    os.sync()
    wall, cpu, _ = run_timed([*argv, "convert-eagle", "--draft", str(draft), "--target", str(target), "--out",
                              str(out), "--quiet", "--format", "json"], {**env, **extra}, cwd=tempfile.gettempdir())
    return wall, cpu


def copy(src: Path, dst: Path, env: dict, *, durable: bool = False) -> tuple[float, float]:
    """``cp -r``; ``durable``: then ``sync`` the copied files (fsync each), the guarantee convert-eagle gives its
    output before it renames it into place."""
    os.sync()
    script = f'cp -r "{src}" "{dst}"' + (f' && sync "{dst}" "{dst}"/*' if durable else "")
    wall, cpu, _ = run_timed(["sh", "-c", script], env)
    return wall, cpu


def bench_cases(codes: dict[str, Path | None], drafts: dict[str, tuple[Path, Path]], work: Path, env: dict,
                repeats: int) -> dict:
    """side -> case -> row. ``codes``: side -> source tree (None: this checkout); ``drafts``: case -> (draft,
    target). Round by round, every side converts once (taking turns at going first) and the output is copied once
    (plain, then durable), so that a busy machine slows all of them alike; every side is compared with the same
    copies."""
    rows: dict[str, dict] = {side: {} for side in codes}
    for case, (draft, target) in drafts.items():
        envs, outs, cold, digests = {}, {}, {}, {}
        warm_page_cache([draft, target])
        for side, code in codes.items():
            cache = work / f"digest-cache-{side}-{case}"
            shutil.rmtree(cache, ignore_errors=True)
            envs[side] = {**env, "NEURONPACK_CACHE_DIR": str(cache)}
            outs[side] = work / f"out-{side}-{case}"
            shutil.rmtree(outs[side], ignore_errors=True)
            cold[side] = convert(code, draft, target, outs[side], envs[side])
            digests[side] = tree_digest(outs[side])
            if side != "after":
                shutil.rmtree(outs[side], ignore_errors=True)  # disk: one output kept to copy
        convert_runs: dict[str, list] = {side: [] for side in codes}
        copy_runs, synced_runs = [], []
        copied = work / f"copy-{case}"
        for round_ in range(repeats):
            # the sides take turns going first: the second conversion of a round measured up to 40% slower here
            for side, code in (list(codes.items()) if round_ % 2 == 0 else list(codes.items())[::-1]):
                shutil.rmtree(outs[side], ignore_errors=True)
                convert_runs[side].append(convert(code, draft, target, outs[side], envs[side]))
                if side != "after":
                    shutil.rmtree(outs[side], ignore_errors=True)
            shutil.rmtree(copied, ignore_errors=True)
            copy_runs.append(copy(outs["after"], copied, env))
            shutil.rmtree(copied, ignore_errors=True)
            synced_runs.append(copy(outs["after"], copied, env, durable=True))
            shutil.rmtree(copied, ignore_errors=True)
        size = sum(p.stat().st_size for p in outs["after"].iterdir())
        copy_wall = statistics.median(r[0] for r in copy_runs)
        synced_wall = statistics.median(r[0] for r in synced_runs)
        for side in codes:
            wall = statistics.median(r[0] for r in convert_runs[side])
            rows[side][case] = {
                "output_bytes": size, "cold_wall_s": round(cold[side][0], 3), "cold_cpu_s": round(cold[side][1], 3),
                "wall_s": round(wall, 3), "cpu_s": round(statistics.median(r[1] for r in convert_runs[side]), 3),
                "copy_wall_s": round(copy_wall, 3), "wall_vs_copy": round(wall / copy_wall, 2),
                "cold_vs_copy": round(cold[side][0] / copy_wall, 2), "synced_copy_wall_s": round(synced_wall, 3),
                "wall_vs_synced_copy": round(wall / synced_wall, 2), "runs": convert_runs[side],
                "copy_runs": copy_runs, "synced_copy_runs": synced_runs, "digest": digests[side]}
        shutil.rmtree(outs["after"], ignore_errors=True)
    return rows


def main() -> None:
    parser = bench_parser("convert_eagle", __doc__, model="smollm2", rounds=5)
    parser.add_argument("--before-commit", default=None, help="also time this commit's code (e.g. main)")
    parser.add_argument("--bytecode", choices=("cached", "none"), default="cached",
                        help="cached: bytecode written once and reused (an installed package); none: every module "
                        "compiled from source on every start (PYTHONDONTWRITEBYTECODE=1)")
    parser.add_argument("--realistic", action="store_true",
                        help="also the ~1.1 GB drafts of a Llama-3.2-1B-class target (~3 GB of disk in --workdir)")
    args = parser.parse_args()
    work = args.workdir = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    target = model_checkpoint(args).resolve()
    drafts = {case: (make_draft(target, work / f"draft-{case}", dtype), target) for case, dtype in DRAFTS.items()}
    if args.realistic:
        big = make_head_only_target(work / "target-1b-head-only")
        drafts.update({case: (make_draft(big, work / f"draft-{case}", dtype), big)
                       for case, dtype in REALISTIC_DRAFTS.items()})
    env = bytecode_env(args.bytecode == "cached", work / "pycache")
    codes: dict[str, Path | None] = {}
    if args.before_commit:
        codes["before"] = old_code(args.before_commit, work)
    codes["after"] = None
    load = {"before": os.getloadavg()}
    sides = bench_cases(codes, drafts, work, env, args.rounds)
    load["after"] = os.getloadavg()
    identical = {case: sides["before"][case]["digest"] == sides["after"][case]["digest"] for case in drafts} \
        if "before" in sides else None
    print(f"convert-eagle vs cp -r of its output (median of {args.rounds}, bytecode {args.bytecode}; "
          f"load {load['before'][0]:.2f} -> {load['after'][0]:.2f})")
    print(f"{'side':7} {'case':13} {'out MB':>7} {'convert s':>10} {'CPU s':>7} {'cp -r s':>8} {'x copy':>7} "
          f"{'cp+sync s':>10} {'x synced':>9} {'cold s':>7} {'cold x':>7}")
    for side, rows in sides.items():
        for case, r in rows.items():
            print(f"{side:7} {case:13} {r['output_bytes'] / 1e6:7.0f} {r['wall_s']:10.3f} {r['cpu_s']:7.3f} "
                  f"{r['copy_wall_s']:8.3f} {r['wall_vs_copy']:7.2f} {r['synced_copy_wall_s']:10.3f} "
                  f"{r['wall_vs_synced_copy']:9.2f} {r['cold_wall_s']:7.3f} {r['cold_vs_copy']:7.2f}")
    if identical is not None:
        print(f"outputs identical before/after (every file): {identical}")
    save_results("convert_eagle", {
        "target": str(target), "realistic": args.realistic, "repeats": args.rounds, "bytecode": args.bytecode,
        "targets_by_case": {case: str(t) for case, (_, t) in drafts.items()},
        "before_commit": args.before_commit, "loadavg": load, "sides": sides, "outputs_identical": identical,
        "target_wall_vs_copy": 2.0})
    plot(sides)
    print(f"saved {OUT_DIR / 'convert_eagle.json'}")


def plot(sides: dict) -> None:
    labels, values, synced = [], [], []
    for side, rows in sides.items():
        for case, r in rows.items():
            labels.append(f"{side}\n{case}")
            values.append(r["wall_vs_copy"])
            synced.append(r["wall_vs_synced_copy"])
    with figure("convert_eagle", figsize=(max(7, 1.1 * len(labels)), 3.8)) as (_, ax):
        x = range(len(labels))
        bars = ax.bar([i - 0.2 for i in x], values, width=0.4, color="#4a7ab5", label="vs cp -r")
        ax.bar_label(bars, fmt="%.2g")
        bars = ax.bar([i + 0.2 for i in x], synced, width=0.4, color="#9ab8de", label="vs cp -r + fsync")
        ax.bar_label(bars, fmt="%.2g")
        ax.set_xticks(list(x), labels)
        ax.set_yscale("log")
        ax.axhline(2.0, color="red", linestyle="--", label="target 2x")
        ax.set_ylabel("convert-eagle wall / cp -r wall")
        ax.set_title("convert-eagle vs copying its output (warm digest cache)")
        ax.legend()


if __name__ == "__main__":
    main()
