"""TEST STAND-IN for ``python -m vllm.entrypoints.openai.api_server`` with the SDK 2.31+ vLLM Neuron plugin (0.21).

Neither vLLM 0.21, the plugin's worker nor neuronx-cc can run here. Everything this stand-in does to the compile
cache is the plugin's OWN code, imported from ../shared/upstream/vllm-neuron-0.21/src (the closed or missing modules
it imports are stubbed beside this file): the root from ``envs.get_neuron_compile_cache_dir()``, keys from
``cache.create_cache_hash``, locks from ``cache._lock``, entries completed by ``cache._store_local``, and at a
serving start the lookups through ``cache.get_local`` / ``cache.fetch_remote_or_compile`` in backend.py's order
(``compile()``, vllm_neuron/compile/backend.py 0.21). What is stood in: the graphs (one small torch.fx graph per
bucket, shaped by the flags the plugin's buckets follow: prefill per num_batched_tokens bucket, decode per num_seqs
bucket, the KV cache by block size and count, the model's KV heads / head_dim over tp, the dtype, the -O level) and
neuronx-cc (the "NEFF" is a few bytes).

Modes, as upstream: ``VLLM_NEURON_CPU_COMPILE=1`` captures and "compiles" every graph into the local root, skips
warm-ups and goes on serving (it never exits); otherwise each graph is looked up and a miss would run neuronx-cc,
which the stand-in refuses (exit 1, FATAL like CompilationLock). One NKI kernel goes through upstream's
``nki_cache.compile_with_cache`` the same way (its key from ``create_nki_cache_key``, its result in ``<root>/nki/``).
Either way it then serves ``GET /health``, ``/v1/models`` and ``/stats`` ({"local_hits", "fetched", "compiled",
"nki_compiled", "nki_hits", "loaded"}) until SIGTERM. A device start (not CPU compile) follows 0.21's worker order,
graph capture and upstream's ``parallel_compile`` first (see ``serve_lookups``).

Faults for tests, NEURONPACK_STANDIN_FAULT: ``exit`` (the CPU compile fails), ``hang`` (it never serves),
``incomplete`` (the last graph's entry never gets upstream's completion marker, as when neuronx-cc died),
``metadata-v1`` (the last graph's metadata is schema version 1: upstream's ``_store_local`` names the file
``.artifact_metadata_v1.json``, which 0.21's ``_is_cache_complete`` accepts and its loader does not read); at a
device start ``new-graph`` (one decode bucket more than was compiled: a graph the artifact lacks) and
``ignore-guards`` (a plugin for which ``VLLM_NEURON_DISABLE_GRAPH_CAPTURE_BACKEND`` and
``VLLM_NEURON_DISABLE_WARMUP_COMPILE`` do nothing). Several faults are comma-separated.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
import torch.fx


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # vLLM's FlexibleArgumentParser: an unknown flag stops the start
        print(f"api_server: error: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="vllm.entrypoints.openai.api_server", allow_abbrev=False)
    for flag in ("--model", "--host", "--dtype", "--served-model-name", "--api-key", "--tool-call-parser"):
        p.add_argument(flag)
    for flag in ("--port", "--tensor-parallel-size", "--max-num-seqs", "--max-model-len", "--max-num-batched-tokens",
                 "--block-size", "--num-gpu-blocks-override"):
        p.add_argument(flag, type=int)
    p.add_argument("--optimization-level", type=int, choices=[0, 1, 2, 3])
    p.add_argument("--additional-config", type=json.loads, default={})
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    return p.parse_args(argv)


class _Step(torch.nn.Module):
    """A stand-in model step: reads the KV cache and the token inputs (the graph text carries the -O level)."""

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def forward(self, input_ids, positions, kv_cache):
        return kv_cache.float().sum() * self.level + (input_ids + positions).float().sum()


def graphs(args: argparse.Namespace) -> list[tuple[str, torch.fx.GraphModule, list[torch.Tensor]]]:
    """(name, graph, meta example inputs) per bucket, as the worker captures them on ``meta`` in CPU compile."""
    config = json.loads((Path(args.model) / "config.json").read_text())
    heads = max(1, config["num_key_value_heads"] // args.tensor_parallel_size)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype = getattr(torch, args.dtype)
    meta = torch.device("meta")
    kv = torch.empty(2, args.num_gpu_blocks_override, args.block_size, heads, head_dim, dtype=dtype, device=meta)
    neuron_config = args.additional_config.get("neuron_config", {})
    out = []
    seqs_buckets = neuron_config.get("num_seqs_buckets", [args.max_num_seqs])
    if "new-graph" in faults() and not os.environ.get("VLLM_NEURON_CPU_COMPILE") == "1":
        seqs_buckets = [*seqs_buckets, max(seqs_buckets) + 1]
    for tokens in neuron_config.get("num_batched_tokens_buckets", [args.max_num_batched_tokens]):
        ids = torch.empty(tokens, dtype=torch.int32, device=meta)
        out.append((f"prefill-{tokens}", _trace(args), [ids, ids, kv]))
    blocks_per_seq = math.ceil(args.max_model_len / args.block_size)
    for seqs in seqs_buckets:
        ids = torch.empty(seqs, blocks_per_seq, dtype=torch.int32, device=meta)
        out.append((f"decode-{seqs}", _trace(args), [ids, ids, kv]))
    return out


def faults() -> set[str]:
    return set(filter(None, os.environ.get("NEURONPACK_STANDIN_FAULT", "").split(",")))


def _trace(args: argparse.Namespace) -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(_Step(args.optimization_level))


def compiler_options() -> dict:
    """The backend options of every graph, as upstream hashes them: ``compile()`` and ``capture()`` both apply
    ``_apply_platform_compiler_args`` first (trn2 gains an fp8 compiler flag). The logical NeuronCore config reaches
    neuronx-cc as an argument; --target is resolved by upstream (env first)."""
    from vllm_neuron.compile.backend import _apply_platform_compiler_args

    return _apply_platform_compiler_args({"compiler_args": f"--lnc {os.environ.get('NEURON_LOGICAL_NC_CONFIG', '1')}"})


def rms_norm_kernel(x, weight):
    """A stand-in NKI kernel (its source is part of upstream's NKI key)."""
    return x * weight


def nki_kernel(args: argparse.Namespace, stats: dict, *, may_compile: bool) -> None:
    """One NKI kernel through upstream's NKI cache (nki/nki_cache.py): compiled at CPU compile, fetched at serve."""
    from vllm_neuron.nki import nki_cache
    from vllm_neuron.nki.nki_compile import NKICompileResult

    config = json.loads((Path(args.model) / "config.json").read_text())
    x = torch.empty(args.max_num_batched_tokens, config["hidden_size"], dtype=getattr(torch, args.dtype),
                    device="meta")
    key = nki_cache.create_nki_cache_key(rms_norm_kernel, {"x": x, "weight": x[0]}, (1,))
    assert key is not None, "upstream could not key the NKI kernel"

    def nki_compile():
        if not may_compile:
            raise RuntimeError(f"stand-in: the NKI kernel {key} would be compiled at server start")
        stats["nki_compiled"] += 1
        return NKICompileResult(dumped_config=json.dumps({"kernel": "rms_norm", "shape": list(x.shape)}),
                                return_types=((x.dtype, tuple(x.shape)),))

    before = stats["nki_compiled"]
    nki_cache.compile_with_cache(key, nki_compile)
    if stats["nki_compiled"] == before:
        stats["nki_hits"] += 1


def cpu_compile(args: argparse.Namespace, stats: dict) -> None:
    from vllm_neuron import envs
    from vllm_neuron.compile import cache
    from vllm_neuron.compile.artifacts import CompilationArtifacts
    from vllm_neuron.compile.schema import create_metadata

    root = envs.get_neuron_compile_cache_dir()
    fault = faults()
    captured = graphs(args)
    for i, (name, gm, inputs) in enumerate(captured):
        options = compiler_options()
        key = cache.create_cache_hash(gm, inputs, options)
        if cache.get_local(key, root):
            stats["local_hits"] += 1
            continue
        if "exit" in fault and i == 1:
            print(f"neuronx-cc compilation failed with -9 for {name}", file=sys.stderr)
            sys.exit(70)
        with cache._lock(key, root) as lock:
            assert lock.acquired()
            entry = Path(root) / key
            entry.mkdir(parents=True, exist_ok=True)
            # what capture and neuronx-cc leave beside the entry's artifacts (absolute paths, logs)
            (entry / "fxgraph.txt").write_text(str(gm.graph))
            (entry / "example_inputs.txt").write_text("\n".join(f"{t.dtype} {tuple(t.shape)}" for t in inputs))
            (entry / "hlo_passes").mkdir(exist_ok=True)
            (entry / "hlo_passes" / "00_pass.txt").write_text(name)
            (entry / "command.txt").write_text(f"neuronx-cc compile {entry}/graph.hlo --framework XLA "
                                               f"--target {os.environ.get('NEURON_PLATFORM_TARGET_OVERRIDE')} "
                                               f"--output {entry / cache.get_neff_filename(str(entry))}")
            (entry / "log-neuron-cc.txt").write_text(f"compiled {name} in {entry}\n")
            (entry / cache.VLLM_NEURON_GRAPH_HLO_FILE).write_bytes(str(gm.graph).encode())
            neff = entry / cache.get_neff_filename(str(entry))
            neff.write_bytes(b"NEFF stand-in " + name.encode() + b" " + key.encode())
            if "incomplete" in fault and i == len(captured) - 1:
                continue  # neuronx-cc died: no metadata, no .compilation_complete
            version = 1 if "metadata-v1" in fault and i == len(captured) - 1 else 0
            metadata = create_metadata(cache_key=key, output_count=1, version=version)
            cache._store_local(key, CompilationArtifacts(str(entry / "graph.hlo"), str(neff), metadata), root)
        stats["compiled"] += 1
    nki_kernel(args, stats, may_compile=True)


def serve_lookups(args: argparse.Namespace, stats: dict) -> None:
    """A device start as 0.21's worker runs it (``compile_or_warm_up_model``, neuron_worker.py ~907-1000), through
    upstream's own cache code: with the graph capture backend on (the default; off with
    ``VLLM_NEURON_DISABLE_GRAPH_CAPTURE_BACKEND``) every graph is captured first, as ``capture()`` does
    (capture_backend.py: a LOCAL hit is skipped, a miss gets its HLO and metadata written into the local root; the
    remote cache and the hit assertions are not consulted there), and upstream's ``parallel_compile()`` then runs
    neuronx-cc (the stand-in on PATH) on every captured HLO. Then the warm-ups look every graph up in ``compile()``'s
    order (backend.py 0.21): local, ``VLLM_NEURON_DISABLE_WARMUP_COMPILE`` / ``VLLM_NEURON_ASSERT_CACHE_HIT``, remote
    under the lock, else neuronx-cc. ``loaded``: the sha256 of each NEFF the start would load, by key."""
    import hashlib

    from vllm_neuron import envs
    from vllm_neuron.compile import cache
    from vllm_neuron.compile.schema import create_metadata

    root = envs.get_neuron_compile_cache_dir()
    captured = [(name, gm, inputs, cache.create_cache_hash(gm, inputs, compiler_options()))
                for name, gm, inputs in graphs(args)]
    guards = "ignore-guards" not in faults()
    if not (guards and envs.VLLM_NEURON_DISABLE_GRAPH_CAPTURE_BACKEND):
        missed = []
        for _name, gm, _inputs, key in captured:
            if cache.get_local(key, root):
                continue  # capture(): "Local cache hit ... Skipping graph capture."
            workdir = Path(root) / key
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / cache.VLLM_NEURON_GRAPH_HLO_FILE).write_bytes(str(gm.graph).encode())
            cache.save_artifact_metadata(str(workdir), create_metadata(cache_key=key, output_count=1))
            missed.append(key)
        from vllm_neuron.compile.parallel_compile import parallel_compile

        parallel_compile(compiler_options())  # upstream's: compiles every captured HLO without a complete entry
        stats["compiled"] += sum(cache._is_cache_complete(str(Path(root) / key)) for key in missed)
    use_cache = not envs.VLLM_NEURON_DISABLE_COMPILE_CACHE
    assert_hits, remote = envs.VLLM_NEURON_ASSERT_CACHE_HIT, envs.VLLM_NEURON_REMOTE_CACHE
    for name, _gm, _inputs, key in captured:
        found = cache.get_local(key, root) if use_cache else None
        if found:
            stats["local_hits"] += 1
        else:
            if guards and envs.VLLM_NEURON_DISABLE_WARMUP_COMPILE:
                raise RuntimeError(f"VLLM_NEURON_DISABLE_WARMUP_COMPILE: local compile cache miss for key {key}.")
            if assert_hits and not remote:
                raise RuntimeError(f"VLLM_NEURON_ASSERT_CACHE_HIT: local compile cache miss for key {key} and "
                                   "remote cache is disabled.")

            def neuronx_cc(name=name, key=key):
                print(f"stand-in: neuronx-cc would compile {name} ({key}) at server start", file=sys.stderr)
                raise RuntimeError(f"neuronx-cc is not available to compile {key}")

            found = cache.fetch_remote_or_compile(key, root, neuronx_cc, envs.VLLM_NEURON_COMPILATION_TIMEOUT,
                                                  invalidate=not use_cache, remote_cache_dir=remote,
                                                  assert_cache_hits=assert_hits)
            stats["fetched"] += 1
        stats["loaded"][key] = hashlib.sha256(Path(found.neff_filename).read_bytes()).hexdigest()
    nki_kernel(args, stats, may_compile=False)


def serve(args: argparse.Namespace, stats: dict) -> None:
    name = args.served_model_name or args.model

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            routes = {"/health": {}, "/stats": stats,
                      "/v1/models": {"object": "list", "data": [{"id": name, "object": "model"}]}}
            if self.path not in routes:
                self.send_error(404)
                return
            body = json.dumps(routes[self.path]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer((args.host or "127.0.0.1", args.port or 8000), Handler)
    print(f"stand-in vLLM serving on {args.host}:{args.port}: {json.dumps(stats)}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while True:
        time.sleep(3600)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    stats = {"local_hits": 0, "fetched": 0, "compiled": 0, "nki_compiled": 0, "nki_hits": 0, "loaded": {}}
    if os.environ.get("VLLM_NEURON_CPU_COMPILE") == "1":
        if "hang" in faults():
            time.sleep(3600)
        cpu_compile(args, stats)
    else:
        serve_lookups(args, stats)
    serve(args, stats)


if __name__ == "__main__":
    main(sys.argv[1:])
