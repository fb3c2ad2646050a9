"""Cost of prompt logits on the serving path: a context graph that also returns the normed hidden states of every
position, vs the same graph returning the last position's logits only (what context graphs did before).

Both graphs are compiled from the same model in one run (AOTInductor, weights outside, loaded through the runtime's
own package loader), then timed interleaved (A, B, A, B, ...) on the same prompt; the best of ``--repeat`` rounds
of ``--calls`` calls is kept. Also timed: ``prompt_logits`` (the same graph plus the LM head over every prompt
position, run only when asked). Output: a table on stdout, ``docs/bench/prompt_logits.json`` and ``.png``.

    .venv/bin/python bench/prompt_logits.py [--model DIR] [--bucket 128] [--prompt-len 100] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import save_bar_plot, save_results  # noqa: E402

from neuronpack.backends.torch_aot import graphs as G  # noqa: E402
from neuronpack.backends.torch_aot import layout as L  # noqa: E402
from neuronpack.backends.torch_aot.load import CompiledLM, _load_runners  # noqa: E402
from neuronpack.backends.torch_aot.target import INDUCTOR_SETTINGS  # noqa: E402
from neuronpack.checkpoint import open_checkpoint  # noqa: E402
from neuronpack.models.loading import load_model, model_tensors  # noqa: E402
from neuronpack.progress import NullReporter  # noqa: E402


class LogitsOnly(nn.Module):
    """The context graph as it was: last-position logits only."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, tokens, last_index, slot, k_caches, v_caches):
        return self.lm.forward_context(tokens, last_index, slot, k_caches, v_caches)


def compile_both(model, bucket: int, package: Path) -> dict[str, float]:
    from torch._inductor.package import package_aoti

    limits = G.GraphLimits(batch_size=1, max_context=bucket, max_seq=bucket)
    caches = G.new_kv_cache(model, 1, bucket, next(model.parameters()).dtype)
    args = G.example_inputs(L.CONTEXT, limits, caches)
    shapes = G.dynamic_shapes(L.CONTEXT, limits, caches)
    seconds, compiled = {}, {}
    for name, module in (("logits_only", LogitsOnly(model)), ("with_hidden", G.ContextGraph(model))):
        start = time.perf_counter()
        with torch.no_grad():
            program = torch.export.export(module, args, strict=False, dynamic_shapes=shapes)
        compiled[name] = torch._inductor.aot_compile(program.module(check_guards=False), program.example_inputs[0],
                                                     options=dict(INDUCTOR_SETTINGS))
        seconds[name] = round(time.perf_counter() - start, 1)
    package_aoti(str(package), compiled)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / ".demo" / "SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--bucket", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=100)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model = load_model(open_checkpoint(args.model), dtype, max_seq_len=args.bucket)
    load_before = os.getloadavg()
    tmp = tempfile.TemporaryDirectory()  # kept until exit: the loaded graphs come from this package
    package = Path(tmp.name) / "graphs.pt2"
    compile_seconds = compile_both(model, args.bucket, package)
    weights = {L.WEIGHT_PREFIX + n: t for n, t in model_tensors(model).items()}
    names = {"logits_only": "logits_only", "with_hidden": "with_hidden"}
    runners = _load_runners(package, {"compiler": "aoti", "graphs": names}, weights, NullReporter().task("", 2))
    cfg = model.config
    config = {"batch_size": 1, "context_encoding_buckets": [args.bucket], "token_generation_buckets": [args.bucket],
              "seq_len": args.bucket, "vocab_size": cfg.vocab_size, "compiler": "aoti", "torch_dtype": args.dtype,
              "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "num_layers": cfg.num_layers,
              "kv_cache_positions": L.cache_positions(args.bucket), "context_outputs": list(L.CONTEXT_OUTPUTS)}
    old = CompiledLM({**config, "context_outputs": []}, {L.CONTEXT: runners["logits_only"], L.TOKEN_GEN: None},
                     weights, ())
    new = CompiledLM(config, {L.CONTEXT: runners["with_hidden"], L.TOKEN_GEN: None}, weights, (),
                     lm_head=model.lm_head)
    prompt = torch.randint(3, cfg.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    same = torch.equal(old.prefill([0], [prompt]), new.prefill([0], [prompt]))
    head_diff = float((new.prompt_logits(prompt)[-1] - new.prefill([0], [prompt])[0]).abs().max())
    sides = {"prefill, logits-only graph": lambda: old.prefill([0], [prompt]),
             "prefill, graph with hidden": lambda: new.prefill([0], [prompt]),
             "prompt_logits (graph + LM head)": lambda: new.prompt_logits(prompt)}
    best = {name: float("inf") for name in sides}
    for _ in range(args.repeat):
        for name, fn in sides.items():
            fn()  # warm
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / args.calls * 1000)
    base = best["prefill, logits-only graph"]
    print(f"{args.model.name} {args.dtype}, context bucket {args.bucket}, prompt {args.prompt_len} tokens, "
          f"{args.threads} thread(s); load {load_before} -> {os.getloadavg()}")
    print(f"{'':34} {'ms/call':>9} {'vs logits-only':>15}")
    for name, ms in best.items():
        print(f"{name:34} {ms:9.2f} {ms / base:14.3f}x")
    print(f"last-token logits equal between graphs: {same}; prompt_logits last row vs prefill max |diff| "
          f"{head_diff:.2e}")
    results = {"model": args.model.name, "dtype": args.dtype, "bucket": args.bucket, "prompt_len": args.prompt_len,
               "threads": args.threads, "ms_per_call": {k: round(v, 3) for k, v in best.items()},
               "ratio_vs_logits_only": {k: round(v / base, 3) for k, v in best.items()},
               "last_logits_equal": same, "prompt_logits_last_row_max_abs_diff": head_diff,
               "compile_seconds": compile_seconds, "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    save_results("prompt_logits", results)
    save_bar_plot("prompt_logits", ["logits only", "with hidden", "prompt_logits"], list(best.values()),
                  ylabel="ms per call", title=f"Context pass, {args.model.name} {args.dtype}, "
                  f"{args.prompt_len} tokens")


if __name__ == "__main__":
    main()
