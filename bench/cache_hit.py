"""Cache-hit `neuronpack compile` vs `neuronpack --version`, for a small and a ~1 GB checkpoint, in one run.

Targets: a hit costs <= 2x `--version`, and the 1 GB hit is within 1.2x of the small one (weights are never re-read:
digests are cached by file stat, safetensors headers are read without torch; a hit imports no torch, none of the
build code and no pydantic: the recipe, validated by the build run before the timed rounds, comes from the recipe
memo, the manifest is checked as JSON).

Every command runs in a fresh process, the commands interleaved round by round so that a busy machine slows them
alike; the table gives medians of wall and CPU seconds (user + system: less sensitive to other jobs). Start-up
depends on bytecode: ``cached`` (bytecode written once and reused, as for an installed package) and ``none`` (every
module compiled from source at every start, as with ``PYTHONDONTWRITEBYTECODE=1``) are both measured. With
``--before-commit`` the same rounds also run that commit's code (``git archive``), for before/after in one run.

    .venv/bin/python -m bench.cache_hit [--rounds 9] [--before-commit main]
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path

from bench._common import (
    ROOT,
    bench_parser,
    bytecode_env,
    neuronpack_argv,
    run_timed,
    save_bar_plot,
    save_results,
    unpack,
)
from tests.helpers.tiny_models import make_tiny_checkpoint, make_tokenizer

RECIPE = ROOT / "recipes" / "tiny-test.toml"
MODES = ("cached", "none")


def make_large_checkpoint(out: Path) -> Path:
    """~1 GB of real weights: a 1-layer Llama whose bulk is a 256k x 1024 fp32 embedding (untied head on top)."""
    import torch
    import transformers

    tok = make_tokenizer()
    cfg = transformers.LlamaConfig(vocab_size=131072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=1,
                                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                                   tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, max_shard_size="400MB")
    tok.save_pretrained(out)
    return out


def commands(code: Path | None, models: dict[str, Path], root: Path) -> dict[str, list[str]]:
    argv, _ = neuronpack_argv(code)
    out = {"version": [*argv, "--version"]}
    for label, model in models.items():
        out[f"hit_{label}"] = [*argv, "compile", str(model), "--recipe", str(RECIPE), "--set", "compiler=export",
                               "--out-root", str(root), "--format", "json", "--quiet"]
    return out


def main() -> None:
    parser = bench_parser("cache_hit", __doc__, rounds=9)
    parser.add_argument("--before-commit", default=None, help="also time this commit's code (e.g. main)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:  # every run starts from empty caches
        tmp = Path(tmp)
        models = {"small": make_tiny_checkpoint(tmp / "small"), "1gb": make_large_checkpoint(tmp / "large")}
        sizes = {k: sum(f.stat().st_size for f in v.glob("*.safetensors")) for k, v in models.items()}
        sides = {"after": None}
        if args.before_commit:
            sides = {"before": unpack(args.before_commit, tmp / "before"), **sides}
        cases = {(side, mode): commands(code, models, tmp / "root") for side, code in sides.items() for mode in MODES}
        envs = {}
        for (side, mode), cmds in cases.items():
            env = {**bytecode_env(mode == "cached", tmp / "pycache"), "NEURONPACK_CACHE_DIR": str(tmp / "cache"),
                   **neuronpack_argv(sides[side])[1]}
            envs[side, mode] = env
            for name, argv in cmds.items():  # builds the artifacts, fills the digest cache, writes bytecode
                _, _, done = run_timed(argv, env, cwd=tmp)
                if name.startswith("hit_") and side == "after" and mode == "cached":
                    assert "cache_hit" in json.loads(done.stdout)
        load = {"before": os.getloadavg()}
        times: dict[tuple, list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for key, cmds in cases.items():
                for name, argv in cmds.items():
                    wall, cpu, done = run_timed(argv, envs[key], cwd=tmp)
                    if name.startswith("hit_"):
                        assert json.loads(done.stdout)["cache_hit"] is True
                    times.setdefault((*key, name), []).append((wall, cpu))
        load["after"] = os.getloadavg()

    rows = []
    for (side, mode), cmds in cases.items():
        v_wall, v_cpu = _medians(times[side, mode, "version"])
        for name in cmds:
            wall, cpu = _medians(times[side, mode, name])
            rows.append({"side": side, "bytecode": mode, "command": name, "wall_s": round(wall, 4),
                         "cpu_s": round(cpu, 4), "wall_vs_version": round(wall / v_wall, 2),
                         "cpu_vs_version": round(cpu / v_cpu, 2)})
    print(f"cache-hit compile vs --version (median of {args.rounds}; load {load['before'][0]:.2f} -> "
          f"{load['after'][0]:.2f}; target hit <= 2.0x --version)")
    print(f"{'side':7} {'bytecode':9} {'command':10} {'wall s':>8} {'CPU s':>8} {'wall x':>7} {'CPU x':>7}")
    for r in rows:
        print(f"{r['side']:7} {r['bytecode']:9} {r['command']:10} {r['wall_s']:8.3f} {r['cpu_s']:8.3f} "
              f"{r['wall_vs_version']:7.2f} {r['cpu_vs_version']:7.2f}")
    after = {(r["bytecode"], r["command"]): r for r in rows if r["side"] == "after"}
    small, large = after["cached", "hit_small"], after["cached", "hit_1gb"]
    print(f"1GB hit / small hit (cached bytecode): {large['wall_s'] / small['wall_s']:.2f}  (target <= 1.2)")
    save_results("cache_hit", {
        "repeats": args.rounds, "before_commit": args.before_commit, "loadavg": load, "checkpoint_bytes": sizes,
        "rows": rows, "hit_1gb_vs_small": round(large["wall_s"] / small["wall_s"], 2),
        "targets": {"hit_vs_version": 2.0, "hit_1gb_vs_small": 1.2},
    })
    hits = [r for r in rows if r["command"] != "version"]
    save_bar_plot("cache_hit", [f"{r['side']}\n{r['bytecode']}\n{r['command'][4:]}" for r in hits],
                  [r["wall_vs_version"] for r in hits], ylabel="hit wall / --version wall (median)",
                  title="cache-hit compile vs --version (target <= 2.0)")


def _medians(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


if __name__ == "__main__":
    main()
