"""int8 weights with bfloat16 compute: how a prefill's linears should multiply, at equal accuracy (docs/quantize.md).

Before #50 a prefill (more than 16 rows) of bfloat16 activations against int8 weights converted every weight to
bfloat16 on every call and ran a bfloat16 GEMM; float32 activations already ran torch's integer GEMM on two int8
rows per row of x (kernels/int8_gemm.cpp). The candidates, each run on the same int8 weights:

* ``dequantize``: the weights converted to bfloat16 on each call, bfloat16 GEMM (the path before);
* ``bf16 tiles``: the weights converted to bfloat16 a 1 MiB tile at a time, each tile's bfloat16 GEMM run while it
  is in the cache (neuronpack's kernel, kernels/int8_gemm.cpp);
* ``two int8 rows``: x[m] ~ s1 q1 + s2 q2 through ``at::_int_mm`` (neuronpack's kernel, as for float32 x);
* ``one int8 row``: x[m] ~ s q per token (vLLM's W8A8 per-token scheme), one ``_int_mm`` of M rows;
* ``per-32 blocks``: x rounded to int8 per block of 32 (llama.cpp's Q8_0 activations; accuracy only: it needs a
  kernel of its own, which torch has not).

Accuracy: SmolLM2-135M-Instruct (real weights), int8 per channel with the head (``include_lm_head``), three texts
(the 494-token passage of bench/peers.py and two halves of it as plain text), every position's logits in one
teacher-forced pass against the bfloat16 model's: mean KL(bfloat16 || candidate) and top-1 agreement. ``one int8
row`` and ``per-32 blocks`` are emulated (x rounded as the scheme does, then a float32 matmul: the integer sums are
exact, so only float32's rounding differs). Speed: the linears of one decoder layer of SmolLM2-135M and of
SmolLM2-1.7B (hidden 2048, intermediate 8192), ``--layers`` copies of each weight so they stream from memory as in a
model, 41 and 494 rows, against the bfloat16 model's own linears (``bf16 weights``: what our bfloat16 build runs);
``--rounds`` paired rounds in alternating order, a ratio the median (min-max) of the per-round ratios to ``bf16
weights``.

    .venv/bin/python -m bench.int8_prefill --model .demo/SmolLM2-135M-Instruct [--threads 1,2] [--rounds 5]

Output: a table on stdout, docs/bench/int8_prefill.json.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench._common import bench_parser, save_results

ROWS = (41, 128, 256, 494)  # a short chat prompt .. the long prompt of bench/peers.py
CANDIDATES = ("dequantize", "bf16 tiles", "two int8 rows", "one int8 row", "per-32 blocks")
KERNEL_MODES = {"bf16 tiles": 0, "two int8 rows": 1}  # torch.ops.neuronpack.set_int8_bf16_prefill
SHAPES = {  # (out, in) of one decoder layer's linears: q, k, v, o, gate, up, down
    "SmolLM2-135M": [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)],
    "SmolLM2-1.7B": [(2048, 2048)] * 4 + [(8192, 2048), (8192, 2048), (2048, 8192)],
}


def round_rows(x: torch.Tensor, block: int | None) -> torch.Tensor:
    """x [M, K] float32 rounded to int8 with a scale per row (``block`` None) or per ``block`` elements."""
    shape = x.shape
    groups = x.reshape(shape[0], -1, block) if block else x.unsqueeze(1)
    s = groups.abs().amax(-1, keepdim=True) / 127
    q = torch.where(s > 0, torch.round(groups / s.clamp_min(1e-30)), torch.zeros_like(groups))
    return (q * s).reshape(shape)


def emulated_forward(block: int | None):
    """An ``Int8Linear.forward`` whose prefill rounds x as the scheme does, then multiplies in float32."""
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        if self.in_features % (block or 1):
            raise ValueError(f"in_features {self.in_features} is not a multiple of {block}")
        y = round_rows(rows, block) @ self.weight.float().T * self.scale.reshape(1, -1)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)
    return forward


def accuracy(model_dir: Path, texts: list[str]) -> dict:
    from transformers import AutoTokenizer

    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint
    from neuronpack.models import load_model
    from neuronpack.models.linear_kernels import use_kernels
    from neuronpack.models.quant import Int8Linear

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = [torch.tensor([tokenizer(t)["input_ids"]]) for t in texts]
    reference = load_model(model_dir, torch.bfloat16)
    with torch.no_grad():
        ref = [reference.forward_full(i)[0].log_softmax(-1) for i in ids]
    del reference
    with tempfile.TemporaryDirectory() as tmp:
        quantize_checkpoint(model_dir, Path(tmp) / "int8", QuantizeOptions("int8", include_lm_head=True))
        model = load_model(Path(tmp) / "int8", torch.bfloat16)
    out = {}
    for name in CANDIDATES:
        if name in KERNEL_MODES:  # the kernel itself (int8_gemm.cpp): every text is longer than 16 tokens
            use_kernels(model)
            torch.ops.neuronpack.set_int8_bf16_prefill(KERNEL_MODES[name])
        patch = {"one int8 row": emulated_forward(None), "per-32 blocks": emulated_forward(32)}.get(name)
        original = Int8Linear.forward
        if patch:
            Int8Linear.forward = patch
        try:
            with torch.no_grad():
                logp = [model.forward_full(i)[0].log_softmax(-1) for i in ids]
        finally:
            Int8Linear.forward = original
            for m in model.modules():
                m.kernel = False
        kl = torch.cat([(r.exp() * (r - c)).sum(-1) for r, c in zip(ref, logp, strict=True)])
        top1 = torch.cat([r.argmax(-1) == c.argmax(-1) for r, c in zip(ref, logp, strict=True)])
        out[name] = {"kl_mean": round(kl.mean().item(), 5), "kl_max": round(kl.max().item(), 4),
                     "top1_agreement": round(top1.float().mean().item(), 4)}
    return {"positions": sum(i.shape[1] for i in ids), "texts_tokens": [i.shape[1] for i in ids], **out}


def layer_weights(shape: list[tuple[int, int]], copies: int, gen: torch.Generator) -> list[tuple]:
    """``copies`` layers' worth of (int8 weight, float32 scale [out, 1], bfloat16 weight) per linear."""
    out = []
    for _ in range(copies):
        for n, k in shape:
            w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
            scale = torch.rand(n, 1, generator=gen) / 3000
            out.append((w, scale, (w.float() * scale).bfloat16()))
    return out


def run_linears(name: str, x: dict[int, torch.Tensor], weights: list[tuple]) -> float:
    """Seconds to run every linear of ``weights`` once on its input rows, the way ``name`` multiplies."""
    start = time.perf_counter()
    for w, scale, wb in weights:
        xi = x[w.shape[1]]
        if name == "bf16 weights":
            torch.ops.neuronpack.linear(xi, wb)
        elif name == "dequantize":  # the float path of linear_int8 before #50, op for op
            F.linear(xi, w.to(torch.bfloat16)).float().mul_(scale.reshape(1, -1)).to(torch.bfloat16)
        elif name in KERNEL_MODES:
            torch.ops.neuronpack.set_int8_bf16_prefill(KERNEL_MODES[name])
            torch.ops.neuronpack.linear_int8(xi, w, scale)
        else:  # one int8 row: the GEMM alone (its rounding of x and scaling not counted: a lower bound)
            torch._int_mm(x[("q", w.shape[1])], w.t())
    return time.perf_counter() - start


def speed(threads: int, rows: int, shape_name: str, copies: int, rounds: int) -> dict:
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    weights = layer_weights(SHAPES[shape_name], copies, gen)
    widths = {k for _, k in SHAPES[shape_name]}
    x = {k: torch.randn(rows, k, generator=gen).bfloat16() for k in widths}
    x.update({("q", k): torch.randint(-127, 128, (rows, k), dtype=torch.int8, generator=gen) for k in widths})
    sides = ["bf16 weights", "dequantize", "bf16 tiles", "two int8 rows", "one int8 row"]
    times: dict[str, list[float]] = {s: [] for s in sides}
    for s in sides:
        run_linears(s, x, weights)  # warm-up
    for r in range(rounds):
        for s in sides if r % 2 == 0 else sides[::-1]:
            times[s].append(run_linears(s, x, weights))
    ops = 2 * rows * sum(n * k for n, k in SHAPES[shape_name]) * copies
    out = {}
    for s in sides:
        ratios = sorted(a / b for a, b in zip(times[s], times["bf16 weights"], strict=True))
        out[s] = {"ms": round(statistics.median(times[s]) * 1000, 2),
                  "gop_s": round(ops / statistics.median(times[s]) / 1e9, 1),
                  "vs_bf16": {"median": round(statistics.median(ratios), 3), "min": round(ratios[0], 3),
                              "max": round(ratios[-1], 3)}}
    return {"threads": threads, "rows": rows, "shape": shape_name, "layers": copies, **out}


def main() -> None:
    parser = bench_parser("int8_prefill", __doc__, model="required", rounds=5, out=True)
    parser.add_argument("--threads", default="1,2", help="thread counts, comma separated (as bench/peers.py)")
    parser.add_argument("--layers", type=int, default=4, help="copies of each layer's weights (streamed)")
    args = parser.parse_args()
    from bench.peers import PASSAGE
    from neuronpack.kernels import load_kernels

    load_kernels()
    half = len(PASSAGE) // 2
    load_before = os.getloadavg()
    report = {"accuracy": accuracy(args.model, [PASSAGE, PASSAGE[:half], PASSAGE[half:]])}
    report["speed"] = [speed(t, rows, shape, args.layers, args.rounds) for t in map(int, args.threads.split(","))
                       for shape in SHAPES for rows in ROWS]
    report.update(rounds=args.rounds, loadavg_before=load_before, loadavg_after=os.getloadavg(),
                  note="shared 2-core machine under load from other jobs: compare the paired ratios")
    save_results(args.out, report)
    print(f"accuracy against the bfloat16 model ({report['accuracy']['positions']} positions):")
    for name in CANDIDATES:
        a = report["accuracy"][name]
        print(f"  {name:15} mean KL {a['kl_mean']:.5f}  max KL {a['kl_max']:.4f}  top-1 {a['top1_agreement']:.4f}")
    print(f"load {load_before} -> {report['loadavg_after']}; time / bf16 weights' time, median (min-max):")
    for r in report["speed"]:
        cells = "  ".join(f"{s} {r[s]['ms']:.1f} ms {r[s]['vs_bf16']['median']:.2f} "
                          f"({r[s]['vs_bf16']['min']:.2f}-{r[s]['vs_bf16']['max']:.2f})"
                          for s in ("bf16 weights", "dequantize", "bf16 tiles", "two int8 rows", "one int8 row"))
        print(f"  {r['shape']:13} {r['threads']}t {r['rows']:4} rows: {cells}")


if __name__ == "__main__":
    main()
