"""Which linear kernel to use for decode: a micro-benchmark of SmolLM2-135M's 210 layer linears at M = 1, 4, 8 rows.

Every path runs the 30 layers' seven projections (q, k, v, o, gate, up, down: 425 MB of float32, far larger than the
caches, so each step streams its weights from memory as a decode step does) with distinct random weights, one thread,
best of ``--rounds`` passes; CPU time (``time.process_time``) and wall. The bound is the weights' bytes over the
streaming read bandwidth measured in the same run. Compiled paths (``compiled ...``) are inductor-generated kernels
(``torch.compile``, the code AOTInductor emits too) over one projection with the weight as an input.

    .venv/bin/python -m bench.linears [--rows 1,4,8] [--rounds 5] [--paths fp32,bf16,int8]

Output: a table on stdout and ``docs/bench/linears.json``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bench._common import bench_parser, read_bandwidth_gbs, save_results
from neuronpack.kernels import load_kernels
from neuronpack.models.quant import int8_gemv
from neuronpack.models.weight_arena import arena_copies

load_kernels()
np_linear, np_linear_int8 = torch.ops.neuronpack.linear, torch.ops.neuronpack.linear_int8

HIDDEN, INTERMEDIATE, KV, LAYERS = 576, 1536, 192, 30
SHAPES = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN),
          (INTERMEDIATE, HIDDEN), (INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]  # (out, in) per layer


def float_weights(dtype: torch.dtype) -> list[torch.Tensor]:
    """The 210 weights, in one huge-page arena as the runtime keeps them (models/weight_arena.py)."""
    torch.manual_seed(0)
    return arena_copies([(torch.randn(o, i) * 0.02).to(dtype) for _ in range(LAYERS) for o, i in SHAPES])


def int8_weights() -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    qs = [(torch.randint(-127, 128, (o, i), dtype=torch.int8), torch.rand(o, 1) * 1e-3)
          for _ in range(LAYERS) for o, i in SHAPES]
    flat = arena_copies([t for pair in qs for t in pair])
    return list(zip(flat[0::2], flat[1::2], strict=True))


def compiled_per_shape(fn: Callable) -> Callable:
    """``fn`` compiled by inductor once per (rows, weight shape): static shapes, like a decode graph."""
    torch._dynamo.config.recompile_limit = 64  # 4 weight shapes x every row count
    return torch.compile(fn, dynamic=False, fullgraph=True)


def time_pass(run: Callable[[torch.Tensor], None], repeat: int) -> tuple[float, float]:
    """(best CPU ms, best wall ms) of ``repeat`` calls of ``run`` after one warm-up."""
    run()
    cpu, wall = float("inf"), float("inf")
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        run()
        cpu, wall = min(cpu, time.process_time() - c0), min(wall, time.perf_counter() - w0)
    return cpu * 1000, wall * 1000


def paths(group: str):
    """(name, act dtype, make(rows) -> per-linear callables over prepared weights, weight bytes) for ``group``."""
    if group in ("fp32", "bf16"):
        dtype = torch.float32 if group == "fp32" else torch.bfloat16
        ws = float_weights(dtype)
        nbytes = sum(w.numel() * w.element_size() for w in ws)
        yield f"{group} F.linear", dtype, lambda m: [lambda x, w=w: F.linear(x, w) for w in ws], nbytes
        yield f"{group} neuronpack kernel", dtype, lambda m: [lambda x, w=w: np_linear(x, w) for w in ws], nbytes
        # oneDNN prepacked for a row count (hint): one layout must serve every batch (format 4 packed for 8)
        for hint in ("M", 1, 8):
            def mkldnn(m, hint=hint):
                packed = [torch.ops.mkldnn._reorder_linear_weight(w, m if hint == "M" else hint) for w in ws]
                return [lambda x, p=p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for p in packed]
            yield f"{group} mkldnn packed (hint {hint})", dtype, mkldnn, nbytes
        if group == "fp32" and torch._C.has_mkl:
            def mkl(m):
                packed = [(torch.ops.mkl._mkl_reorder_linear_weight(w, m), w) for w in ws]
                return [lambda x, p=p, w=w: torch.ops.mkl._mkl_linear(x, p, w, None, m) for p, w in packed]
            yield f"{group} mkl packed (hint M)", dtype, mkl, nbytes
        reduce = compiled_per_shape(lambda x, w: (x.float().unsqueeze(1) * w.float()).sum(-1).to(x.dtype))
        yield f"{group} compiled sum(x*w)", dtype, lambda m: [lambda x, w=w: reduce(x, w) for w in ws], nbytes
        mm = compiled_per_shape(lambda x, w: F.linear(x, w))
        yield f"{group} compiled F.linear", dtype, lambda m: [lambda x, w=w: mm(x, w) for w in ws], nbytes
        del ws
        return
    qs = int8_weights()
    nbytes = sum(w.numel() + s.numel() * 4 for w, s in qs)
    for dtype, tag in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        yield (f"int8 neuronpack kernel, {tag} act", dtype,
               lambda m: [lambda x, w=w, s=s: np_linear_int8(x, w, s) for w, s in qs], nbytes)
        gemv = compiled_per_shape(lambda x, w, s: (int8_gemv(x, w) * s.reshape(1, -1)).to(x.dtype))
        yield (f"int8 compiled gemv, {tag} act", dtype,
               lambda m, g=gemv: [lambda x, w=w, s=s: g(x, w, s) for w, s in qs], nbytes)
        flat = [(w, s.reshape(-1).to(dtype)) for w, s in qs]
        yield (f"int8 _weight_int8pack_mm, {tag} act", dtype,
               lambda m, flat=flat: [lambda x, w=w, s=s: torch._weight_int8pack_mm(x, w, s) for w, s in flat], nbytes)
        deq = compiled_per_shape(lambda x, w, s: (F.linear(x, w.to(x.dtype)).float() * s.reshape(1, -1)).to(x.dtype))
        yield (f"int8 compiled dequant+mm, {tag} act", dtype,
               lambda m, d=deq: [lambda x, w=w, s=s: d(x, w, s) for w, s in qs], nbytes)


def main() -> None:
    parser = bench_parser("linears", __doc__, rounds=5, out=True)
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--paths", default="fp32,bf16,int8")
    parser.add_argument("--only", default="", help="run only paths whose name contains this")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [int(r) for r in args.rows.split(",")]
    load_before = os.getloadavg()
    bandwidth = read_bandwidth_gbs()
    results = []
    print(f"read bandwidth {bandwidth:.1f} GB/s, 1 thread, load {load_before}")
    print(f"{'path':40} {'M':>2} {'cpu ms':>7} {'wall ms':>7} {'% bound':>7} {'vs M=1':>6}")
    for group in args.paths.split(","):
        for name, dtype, make, nbytes in paths(group):
            if args.only not in name:
                continue
            bound_ms = nbytes / (bandwidth * 1e9) * 1000
            first = None
            for m in rows:
                torch.manual_seed(1)
                in_features = {i for _, i in SHAPES}
                xs = {i: torch.randn(m, i).to(dtype) for i in in_features}
                linears = make(m)
                inputs = [xs[i] for _ in range(LAYERS) for _, i in SHAPES]

                def run(linears=linears, inputs=inputs):
                    with torch.inference_mode():
                        for f, x in zip(linears, inputs, strict=True):
                            f(x)

                cpu, wall = time_pass(run, args.rounds)
                first = first or cpu
                results.append({"path": name, "rows": m, "cpu_ms": round(cpu, 2), "wall_ms": round(wall, 2),
                                "weight_bytes": nbytes, "bound_ms": round(bound_ms, 2),
                                "of_bound": round(bound_ms / cpu, 3), "vs_rows_1": round(cpu / first, 2)})
                print(f"{name:40} {m:2} {cpu:7.1f} {wall:7.1f} {bound_ms / cpu:7.0%} {cpu / first:6.2f}", flush=True)
                del linears
    report = {"torch": torch.__version__, "threads": 1, "read_bandwidth_gbs": round(bandwidth, 1),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "loadavg_before": load_before,
              "loadavg_after": os.getloadavg(), "shapes": SHAPES, "layers": LAYERS, "results": results}
    save_results(args.out, report)


if __name__ == "__main__":
    main()
