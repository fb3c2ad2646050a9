"""EAGLE drafting on SmolLM2-135M-Instruct's shapes: the compiled draft graphs (what an EAGLE artifact ships) vs the
same draft in eager PyTorch, for EAGLE-1 and EAGLE-3 drafts, one and four sequences, in one run.

There is no trained EAGLE draft for SmolLM2 offline, so the drafts are random, in the original layouts (EAGLE-1:
fc [H, 2H] + one decoder layer; EAGLE-3: fc [H, 3H], midlayer.* with 2H-input q/k/v, its own norm and full-vocabulary
head, d2t / t2d) and converted by ``convert_eagle`` against the real target. Their acceptance means nothing; their
cost is the real cost of a draft of these shapes. The draft graphs are compiled here exactly as the build compiles
them (``export_draft_graph`` + AOTInductor, weights as inputs, the linears on neuronpack's kernels) and run through
``CompiledDraft``; the eager side is the same draft with ``F.linear``.

One measured step is what the EAGLE proposer does per engine step in steady state: the verified positions' hidden
states come in (``verified``, 3 kept of k + 1 = 5), then ``propose`` catches up over them (one call of T = 3 per
sequence) and drafts k = 4 tokens (three more T = 1 calls and four heads). CPU time (``time.process_time``) and wall,
one torch thread, median of ``--rounds`` steps, eager and compiled interleaved.

    .venv/bin/python -m bench.eagle_draft [--rounds 20] [--layouts eagle1 eagle3]

Output: a table on stdout, docs/bench/eagle_draft.json and docs/bench/eagle_draft.png.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch

from bench._common import bench_parser, model_checkpoint, save_bar_plot, save_results
from tests.convert.eagle_fixtures import layer_shapes  # the EAGLE checkpoint layouts, one place

K, KEPT, PROMPT_LEN = 4, 3, 64


def make_draft(target: Path, layout: str, out: Path) -> Path:
    """A random draft of the target's shapes in ``layout``'s original form, converted by convert_eagle."""
    from safetensors.torch import save_file

    from neuronpack.convert.eagle import convert_eagle

    converted = out / f"{layout}-converted"
    if (converted / "config.json").is_file():
        return converted
    hf = json.loads((target / "config.json").read_text())
    h, inter, vocab = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    heads, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    hd = h // heads
    gen = torch.Generator().manual_seed(0)
    eagle3 = layout == "eagle3"
    prefix, attn_in = ("midlayer", 2 * h) if eagle3 else ("layers.0", h)
    shapes = {
        **layer_shapes(prefix, h, hd, attn_in, heads=heads, kv_heads=kv, intermediate=inter),
        f"{prefix}.post_attention_layernorm.weight": (h,),
    }
    if eagle3:
        shapes.update({"fc.weight": (h, 3 * h), "midlayer.hidden_norm.weight": (h,),
                       "midlayer.input_layernorm.weight": (h,), "norm.weight": (h,), "lm_head.weight": (vocab, h)})
    else:
        shapes.update({"fc.weight": (h, 2 * h), "fc.bias": (h,), "embed_tokens.weight": (vocab, h)})
    tensors = {n: (torch.randn(s, generator=gen) * (1.0 if len(s) == 1 else 0.02)).to(torch.bfloat16)
               for n, s in shapes.items()}
    if eagle3:
        tensors["d2t"] = torch.zeros(vocab, dtype=torch.int64)
        tensors["t2d"] = torch.ones(vocab, dtype=torch.bool)
    raw = out / f"{layout}-original"
    raw.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(raw / "model.safetensors"), metadata={"format": "pt"})
    config = {**{k: hf[k] for k in ("model_type", "hidden_size", "intermediate_size", "num_attention_heads",
                                     "num_key_value_heads", "vocab_size", "rms_norm_eps", "rope_theta",
                                     "rope_parameters", "rope_scaling", "max_position_embeddings") if k in hf},
              "architectures": ["LlamaForCausalLMEagle3" if eagle3 else "LlamaForCausalLM"],
              "num_hidden_layers": 1, "torch_dtype": "bfloat16", "bias": not eagle3}
    if eagle3:
        config["draft_vocab_size"] = vocab
    (raw / "config.json").write_text(json.dumps(config, indent=2))
    convert_eagle(raw, target, converted)
    return converted


def compiled_draft(draft, work: Path, layout: str, limits):
    """The draft graphs compiled with AOTInductor as the build does (the linears call neuronpack's kernels; cached
    per layout in ``work``), bound to ``draft`` (its linears flagged for the kernels too)."""
    from neuronpack.backends.torch_aot.draft_graphs import CompiledDraft, export_draft_graph
    from neuronpack.backends.torch_aot.layout import DRAFT_GRAPHS
    from neuronpack.backends.torch_aot.runners import boxed
    from neuronpack.backends.torch_aot.torch_api import aoti_package_loader

    runners, seconds = {}, {}
    for name in DRAFT_GRAPHS:
        package = work / f"{layout}-{name}-kernels.pt2"
        if not package.is_file():
            start = time.perf_counter()
            program = export_draft_graph(draft, name, limits, kernels=True)
            torch._inductor.aoti_compile_and_package(program, package_path=str(package))
            seconds[name] = round(time.perf_counter() - start, 1)
        runners[name] = boxed(aoti_package_loader(str(package), "model"))
    return CompiledDraft(runners, draft, limits.max_tokens, kernels=True), seconds


def one_step(proposer, state: dict, hidden_in: int, gen) -> tuple[float, float, list[list[int]]]:
    """verified (KEPT of K + 1) then propose K, for every sequence; -> (cpu s, wall s, drafts)."""
    from neuronpack.runtime.engine.speculation.proposer import DraftRequest

    ids = list(state)
    hidden = torch.randn(len(ids), K + 1, hidden_in, generator=gen)
    c0, w0 = time.process_time(), time.perf_counter()
    proposer.verified(ids, [KEPT - 1] * len(ids), hidden)
    for rid in ids:
        state[rid] += torch.randint(0, 1000, (KEPT,), generator=gen).tolist()
    drafts = proposer.propose([DraftRequest(rid, state[rid], K, row) for row, rid in enumerate(ids)])
    return time.process_time() - c0, time.perf_counter() - w0, [d.token_ids for d in drafts]


def start(proposer, n: int, hidden_in: int, seed: int) -> dict:
    """n sequences with a PROMPT_LEN prompt: prefilled, first propose (the catch-up over the prompt)."""
    from neuronpack.runtime.engine.speculation.proposer import DraftRequest

    gen = torch.Generator().manual_seed(seed)
    state = {f"r{i}": torch.randint(0, 1000, (PROMPT_LEN + 1,), generator=gen).tolist() for i in range(n)}
    proposer.prefilled(list(state), [torch.randn(PROMPT_LEN, hidden_in, generator=gen) for _ in state])
    proposer.propose([DraftRequest(rid, ids, K, row) for row, (rid, ids) in enumerate(state.items())])
    return state


def measure(drafts: dict, graphs, batch: int, repeat: int, hidden_in: int) -> dict:
    from neuronpack.runtime.engine.speculation.eagle import EagleProposer

    sides = {"eager": EagleProposer(drafts["eager"], rows=batch),
             "compiled": EagleProposer(drafts["compiled"], graphs, rows=batch)}
    states = {name: start(p, batch, hidden_in, seed=1) for name, p in sides.items()}
    gens = {name: torch.Generator().manual_seed(2) for name in sides}
    times = {name: {"cpu": [], "wall": []} for name in sides}
    agree = total = 0
    for _ in range(repeat):  # interleaved: both sides see the same machine load, the same inputs
        outs = {}
        for name, proposer in sides.items():
            cpu, wall, outs[name] = one_step(proposer, states[name], hidden_in, gens[name])
            times[name]["cpu"].append(cpu)
            times[name]["wall"].append(wall)
        for a, b in zip(outs["eager"], outs["compiled"], strict=True):
            agree += sum(x == y for x, y in zip(a, b, strict=False))
            total += len(a)
    row = {f"{name}_{kind}_ms": round(1000 * statistics.median(v[kind]), 2) for name, v in times.items()
           for kind in ("cpu", "wall")}
    row["compiled_vs_eager_cpu"] = round(row["compiled_cpu_ms"] / row["eager_cpu_ms"], 3)
    row["compiled_vs_eager_wall"] = round(row["compiled_wall_ms"] / row["eager_wall_ms"], 3)
    row["drafts_equal_fraction"] = round(agree / max(total, 1), 3)
    return row


def main() -> None:
    parser = bench_parser("eagle_draft", __doc__, model="smollm2", rounds=20)
    parser.add_argument("--layouts", nargs="+", default=["eagle1", "eagle3"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    torch.set_num_threads(1)
    from neuronpack.backends.torch_aot.graphs import GraphLimits
    from neuronpack.models.eagle import load_eagle_draft

    args.workdir.mkdir(parents=True, exist_ok=True)
    target = model_checkpoint(args)
    layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    limits = GraphLimits(batch_size=max(args.batches), max_tokens=PROMPT_LEN, max_seq=256)
    rows, compile_seconds = [], {}
    for layout in args.layouts:
        path = make_draft(target, layout, args.workdir)
        drafts = {side: load_eagle_draft(path, torch.float32, target_layers=layers) for side in ("eager", "compiled")}
        hidden_in = drafts["eager"].fc.weight.shape[1] - (0 if drafts["eager"].eagle3 else
                                                          drafts["eager"].config.hidden_size)
        graphs, compile_seconds[layout] = compiled_draft(drafts["compiled"], args.workdir, layout, limits)
        for batch in args.batches:
            rows.append({"layout": layout, "sequences": batch, **measure(drafts, graphs, batch, args.rounds,
                                                                         hidden_in)})
    print(f"{'layout':8} {'seqs':>4} {'eager cpu ms':>13} {'compiled cpu ms':>16} {'ratio':>6} "
          f"{'eager wall':>11} {'compiled wall':>14} {'ratio':>6} {'same drafts':>12}")
    for r in rows:
        print(f"{r['layout']:8} {r['sequences']:>4} {r['eager_cpu_ms']:>13} {r['compiled_cpu_ms']:>16} "
              f"{r['compiled_vs_eager_cpu']:>6} {r['eager_wall_ms']:>11} {r['compiled_wall_ms']:>14} "
              f"{r['compiled_vs_eager_wall']:>6} {r['drafts_equal_fraction']:>12}")
    save_results("eagle_draft", {
        "what": f"one EAGLE proposer step (verified: {KEPT} kept, then propose k={K}) on SmolLM2-135M shapes, fp32, "
                "1 torch thread, random drafts converted by convert_eagle; median of repeats",
        "load_average": os.getloadavg(), "repeat": args.rounds, "compile_seconds": compile_seconds, "rows": rows})
    save_bar_plot("eagle_draft", [f"{r['layout']} x{r['sequences']}" for r in rows],
                  [r["compiled_vs_eager_cpu"] for r in rows], ylabel="compiled / eager CPU time",
                  title="EAGLE proposer step: compiled draft graphs vs eager (lower is better)")


if __name__ == "__main__":
    main()
