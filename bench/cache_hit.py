"""Cache-hit `neuronpack compile` vs `neuronpack --version`, for a small and a ~1 GB checkpoint, in one run.

Targets: a hit costs <= 2x `--version`, and the 1 GB hit is within 1.2x of the small one (weights are never re-read:
digests are cached by file stat, safetensors headers are read without torch).

    .venv/bin/python bench/cache_hit.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import NEURONPACK, ROOT, median, save_bar_plot, save_results, time_command  # noqa: E402

RECIPE = ROOT / "recipes" / "tiny-test.toml"


def make_large_checkpoint(out: Path) -> Path:
    """~1 GB of real weights: a 1-layer Llama whose bulk is a 256k x 1024 fp32 embedding (untied head on top)."""
    import torch
    import transformers
    from tiny_models import make_tokenizer

    tok = make_tokenizer()
    cfg = transformers.LlamaConfig(vocab_size=131072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=1,
                                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                                   tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, max_shard_size="400MB")
    tok.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    from tiny_models import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {"NEURONPACK_CACHE_DIR": str(tmp / "cache")}
        models = {"small": make_tiny_checkpoint(tmp / "small"), "1GB": make_large_checkpoint(tmp / "large")}
        sizes = {k: sum(f.stat().st_size for f in v.glob("*.safetensors")) for k, v in models.items()}
        rows = {}
        for label, model in models.items():
            argv = [*NEURONPACK, "compile", str(model), "--recipe", str(RECIPE), "--set", "compiler=export",
                    "--out-root", str(tmp / "root"), "--format", "json", "--quiet"]
            first = subprocess.run(argv, check=True, capture_output=True, text=True, env={**os.environ, **env})
            assert json.loads(first.stdout)["cache_hit"] is False
            rows[label] = time_command(argv, repeats=args.repeats, env=env)
        version = time_command([*NEURONPACK, "--version"], repeats=args.repeats, env=env)

    v = median(version)
    small, large = median(rows["small"]), median(rows["1GB"])
    table = [
        ("neuronpack --version", v, 1.0),
        (f"compile cache hit, small ({sizes['small'] / 1e6:.1f} MB)", small, small / v),
        (f"compile cache hit, 1GB ({sizes['1GB'] / 1e9:.2f} GB)", large, large / v),
    ]
    print(f"{'command':<44} {'median s':>9} {'x --version':>12}")
    for name, seconds, ratio in table:
        print(f"{name:<44} {seconds:>9.3f} {ratio:>12.2f}")
    print(f"1GB hit / small hit: {large / small:.2f}  (targets: hit <= 2.0x --version, 1GB/small <= 1.2)")
    save_results("cache_hit", {
        "repeats": args.repeats,
        "median_seconds": {"version": v, "hit_small": small, "hit_1gb": large},
        "checkpoint_bytes": sizes,
        "ratios": {
            "hit_small_vs_version": small / v,
            "hit_1gb_vs_version": large / v,
            "hit_1gb_vs_small": large / small,
        },
        "targets": {"hit_vs_version": 2.0, "hit_1gb_vs_small": 1.2},
    })
    save_bar_plot("cache_hit", ["--version", "hit small", "hit 1GB"], [v, small, large], ylabel="seconds (median)",
                  title="cache-hit compile vs --version")


if __name__ == "__main__":
    main()
