"""Compile once per graph: the demo recipe on SmolLM2-135M-Instruct, then a fine-tune of it (every weight changed,
same names / shapes / dtypes), in paired rounds on a fresh machine's state each round (empty inductor cache, empty
neuronpack cache: the kernels library is built again, as on a new build box).

Each round, in one process tree:
- ``full``: the demo recipe compiled cold (the first build of a model);
- ``reuse``: the fine-tune compiled next into the same root: it takes the first artifact's graphs (same graph key);
- ``no_reuse``: the same fine-tune with ``--no-reuse`` into another root, right after (inductor's cache warm, as the
  issue measured before reuse existed: every graph compiled again);
- ``remote``: the first artifact pushed to a real S3 server (moto on 127.0.0.1), then the fine-tune compiled on a
  fresh root and fresh caches with ``--remote``: only the donor's graph files are downloaded.
Then the fine-tune's reused artifact generates greedily and is compared token for token with transformers on the
fine-tune's weights.

    .venv/bin/python -m bench.compile_reuse [--model .demo/SmolLM2-135M-Instruct] [--rounds 2]
    make bench-compile_reuse

Target: reuse / full <= 0.15 (wall). Output: a table on stdout, docs/bench/compile_reuse.json + .png.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from bench._common import (
    NEURONPACK,
    OUT_DIR,
    ROOT,
    bench_parser,
    chat_prompt_ids,
    median,
    model_checkpoint,
    run_timed,
    save_bar_plot,
    save_results,
)
from tests.helpers.moto_s3 import MotoServer
from tests.helpers.tiny_models import fine_tune_copy

RECIPE = ROOT / "recipes" / "smollm2-135m-cpu.toml"
SIDES = ("full", "reuse", "no_reuse", "remote")


def fine_tune(model: Path, out: Path) -> Path:
    """Every floating tensor of ``model`` scaled by 1.01 plus seeded noise of 1% of its std: a fine-tune's shape."""
    if not (out / "config.json").is_file():
        fine_tune_copy(model, out)
    return out


def compile_once(model: Path, root: Path, cache: Path, *extra: str, env: dict | None = None) -> dict:
    env = {**os.environ, **(env or {}), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
           "NEURONPACK_CACHE_DIR": str(cache / "neuronpack")}
    argv = [*NEURONPACK, "compile", str(model), "--recipe", str(RECIPE), "--out-root", str(root), "--format", "json",
            "--quiet", *extra]
    wall, cpu, done = run_timed(argv, env, cwd=root.parent)
    result = json.loads(done.stdout)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "key": result["key"], "path": result["path"],
            "graphs_from": result.get("graphs_from"), "build_s": result["timings"].get("build")}


def one_round(model: Path, tuned: Path, work: Path, store_url: str, env: dict) -> dict:
    work.mkdir(parents=True)
    full = compile_once(model, work / "root", work / "cache")
    reuse = compile_once(tuned, work / "root", work / "cache")
    assert reuse["graphs_from"] and reuse["graphs_from"]["key"] == full["key"], reuse
    no_reuse = compile_once(tuned, work / "root-no-reuse", work / "cache", "--no-reuse")
    assert no_reuse["graphs_from"] is None
    done = run_timed([*NEURONPACK, "push", full["path"], store_url, "--format", "json", "--quiet"], env)[2]
    assert json.loads(done.stdout)["pushed"], done.stdout
    remote = compile_once(tuned, work / "root-fresh", work / "cache-fresh", "--remote", store_url, env=env)
    assert remote["graphs_from"]["source"] == store_url and remote["key"] == reuse["key"], remote
    return {"full": full, "reuse": reuse, "no_reuse": no_reuse, "remote": remote}


def greedy_check(artifact: Path, tuned: Path, tokens: int = 32) -> dict:
    """The reused artifact's greedy continuation against transformers' on the fine-tune's weights."""
    import torch
    import transformers

    from neuronpack.backends.torch_aot import load_artifact

    prompt = chat_prompt_ids(tuned)[0]
    lm = load_artifact(artifact)
    ours = [int(lm.prefill([0], [prompt]).argmax(-1)[0])]
    token, position = torch.zeros(lm.batch_size, dtype=torch.long), torch.zeros(lm.batch_size, dtype=torch.long)
    token[0], position[0] = ours[0], len(prompt)
    for _ in range(tokens - 1):
        token = lm.decode(token, position).argmax(-1)
        position += 1
        ours.append(int(token[0]))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tuned, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                          pad_token_id=0)
    theirs = out[0, len(prompt):].tolist()
    return {"tokens": tokens, "equal": ours == theirs, "ours": ours, "transformers": theirs}


def main() -> None:
    parser = bench_parser("compile_reuse", __doc__, model="smollm2", rounds=2)
    args = parser.parse_args()
    model = model_checkpoint(args)
    shutil.rmtree(args.workdir / "rounds", ignore_errors=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    tuned = fine_tune(model, args.workdir / "fine-tune")
    rounds = []
    with MotoServer() as server:
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": server.endpoint}
        for i in range(args.rounds):
            bucket = f"reuse-{i}"
            server.create_bucket(bucket)
            print(f"round {i + 1}/{args.rounds}", file=sys.stderr)
            rounds.append(one_round(model, tuned, args.workdir / "rounds" / str(i), f"s3://{bucket}/ci", env))
    greedy = greedy_check(Path(rounds[-1]["reuse"]["path"]), tuned)
    ratios = {side: [r[side]["wall_s"] / r["full"]["wall_s"] for r in rounds] for side in SIDES[1:]}
    summary = {side: {"wall_s": median([r[side]["wall_s"] for r in rounds]),
                      "cpu_s": median([r[side]["cpu_s"] for r in rounds])} for side in SIDES}
    save_results("compile_reuse", {
        "recipe": str(RECIPE.relative_to(ROOT)), "rounds": rounds, "summary": summary,
        "ratios_vs_full": {side: {"median": median(v), "min": min(v), "max": max(v)} for side, v in ratios.items()},
        "greedy": greedy, "target": {"reuse_vs_full": 0.15}})
    save_bar_plot("compile_reuse", ["full (cold)", "fine-tune, reuse", "fine-tune, --no-reuse", "fine-tune, --remote"],
                  [summary[s]["wall_s"] for s in SIDES], ylabel="seconds (median wall)",
                  title="SmolLM2 demo recipe: a fine-tune with and without graph reuse")
    print(f"{'side':10} {'wall s':>8} {'CPU s':>8} {'x full (median, min-max)':>28}")
    for side in SIDES:
        spread = ("1.00" if side == "full" else
                  f"{median(ratios[side]):.3f} ({min(ratios[side]):.3f}-{max(ratios[side]):.3f})")
        print(f"{side:10} {summary[side]['wall_s']:8.1f} {summary[side]['cpu_s']:8.1f} {spread:>28}")
    print(f"greedy tokens of the reused fine-tune equal transformers': {greedy['equal']} ({greedy['tokens']} tokens); "
          f"target reuse/full <= 0.15; saved {OUT_DIR / 'compile_reuse.json'}")


if __name__ == "__main__":
    main()
