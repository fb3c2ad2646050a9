"""Build time of the demo recipe (recipes/smollm2-135m-cpu.toml, SmolLM2-135M-Instruct) before and after, in one run.

"before" is the code of a given commit (default fc67a63, the last one with one static graph per bucket), unpacked
with ``git archive`` into the work directory and run with the same interpreter; "after" is this checkout. Each side runs
``neuronpack compile`` in a fresh process with an empty inductor cache and a fresh output root, and records wall
seconds, CPU seconds (user + system of the process and its compiler children) and the load average around it.
On a shared machine compare the CPU seconds too: wall time there mostly measures the other jobs.

    .venv/bin/python -m bench.compile [--model DIR] [--before-commit fc67a63] [--sides before,after]
                                      [--previous docs/bench/compile.json]   # reuse its sides not re-run now

Target: after / before <= 0.4 (wall, same machine). Output: table on stdout, docs/bench/compile.json + .png.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench._common import (
    OUT_DIR,
    ROOT,
    bench_parser,
    model_checkpoint,
    neuronpack_argv,
    old_code,
    save_bar_plot,
    save_results,
)

RECIPE = "recipes/smollm2-135m-cpu.toml"


def build(code: Path, model: Path, work: Path, label: str) -> dict:
    """One cold ``neuronpack compile`` of the demo recipe with the code in ``code``."""
    prefix, code_env = neuronpack_argv(code)
    # cold caches: inductor's, and neuronpack's own (digests, remembered recipes, the kernel library it builds once
    # per machine), so the first build on a fresh machine is what is timed
    env = {**os.environ, **code_env, "TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor-{label}"),
           "NEURONPACK_CACHE_DIR": str(work / f"neuronpack-cache-{label}")}
    argv = [*prefix, "compile", str(model), "--recipe", str(code / RECIPE),
            "--out-root", str(work / f"root-{label}"), "--format", "json", "--quiet", "--force"]
    load_before = os.getloadavg()
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # cwd outside any checkout: the build's own worker processes (python -m ...) must import ``code`` too
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, cwd=work)
    wall = time.perf_counter() - start
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    result = json.loads(out.stdout)
    return {"label": label, "code": str(code), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "build_s": result["timings"].get("build"), "key": result["key"],
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()}


def main() -> None:
    parser = bench_parser("compile", __doc__, model="smollm2")
    parser.add_argument("--before-commit", default="fc67a63")
    parser.add_argument("--sides", default="before,after")
    parser.add_argument("--previous", type=Path, default=None, help="a compile.json whose other sides are kept")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    model = model_checkpoint(args)
    sides = {s["label"]: s for s in json.loads(args.previous.read_text())["sides"]} if args.previous else {}
    for label in args.sides.split(","):
        code = ROOT if label == "after" else old_code(args.before_commit, args.workdir)
        print(f"building the demo recipe with the {label} code ({code})", file=sys.stderr)
        sides[label] = {**build(code, model, args.workdir, label),
                        "commit": args.before_commit if label == "before" else "HEAD"}
    before, after = sides["before"], sides["after"]
    ratios = {"wall_after_vs_before": after["wall_s"] / before["wall_s"],
              "cpu_after_vs_before": after["cpu_s"] / before["cpu_s"]}
    save_results("compile", {"recipe": RECIPE, "sides": list(sides.values()), "ratios": ratios,
                             "target": {"wall_after_vs_before": 0.4}})
    save_bar_plot("compile", ["before wall", "after wall", "before CPU", "after CPU"],
                  [before["wall_s"], after["wall_s"], before["cpu_s"], after["cpu_s"]], ylabel="seconds",
                  title="demo recipe build: before vs after")
    print(f"{'side':8} {'wall s':>8} {'CPU s':>8}  load average before -> after")
    for side in (before, after):
        print(f"{side['label']:8} {side['wall_s']:8.1f} {side['cpu_s']:8.1f}  {side['loadavg_before']} -> "
              f"{side['loadavg_after']}")
    print(f"after / before: wall {ratios['wall_after_vs_before']:.2f}, CPU {ratios['cpu_after_vs_before']:.2f} "
          f"(target wall <= 0.4); saved {OUT_DIR / 'compile.json'}")


if __name__ == "__main__":
    main()
