"""Buckets planned from traffic vs NxD Inference's auto buckets: padding on seeded traces, routed by upstream.

For each trace, the nxd recipe recipes/llama-3.1-8b-instruct-trn1.toml (seq_len and max_context_length 8192: NxDI's
auto plan is 7 context + 7 token-generation buckets, 128 .. 8192) is planned by ``neuronpack buckets plan``'s code
(neuronpack.planner) as the command plans it: at the auto plan's 14 graphs (the default budget, split between the
kinds by the planner) and at half its graphs (a budget of 7). Every prompt length and every decode KV length of
the trace is then routed by upstream NxD Inference 0.9.0's own ``ModelWrapper.get_target_bucket``
(bench/_nxdi_routing.py in .venv-nxdi, ../shared/upstream), and the
padding is counted from those routes: padded prompt tokens per request, padded KV positions per generated token
(each request's decode steps at KV lengths prompt + 1 .. prompt + completion - 1). The planner's own routing model
is checked equal to upstream's on every length. The padding is deterministic: no timing, one run.

Traces (seeded): chat (prompts lognormal, 20-1,000 tokens), rag (600-2,000), bimodal (short chat and long documents),
shared-prefix (bench/traces/shared-prefix.jsonl: the shared-prefix bench's load, bench/_shared_prefix.py, served by
``neuronpack serve --request-log`` and recorded by it; ``--make-shared-prefix-trace MODEL`` records it again).

    .venv/bin/python -m bench.buckets_plan [--requests 2000] [--seed 46]      # make bench-buckets_plan
    .venv/bin/python -m bench.buckets_plan --make-shared-prefix-trace .demo/SmolLM2-135M-Instruct

Writes docs/bench/buckets_plan.json and .png.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import tempfile
from pathlib import Path

from bench._common import ROOT, bench_parser, figure, save_results
from neuronpack.planner.demand import build_demand
from neuronpack.planner.frameworks import framework_rules
from neuronpack.planner.plan import plan_from_traffic
from neuronpack.recipe import load_recipe
from neuronpack.traffic import Traffic, TrafficRecord, read_traffic

RECIPE = ROOT / "recipes" / "llama-3.1-8b-instruct-trn1.toml"
SHARED_PREFIX = ROOT / "bench" / "traces" / "shared-prefix.jsonl"
UPSTREAM = ROOT.parent / "shared" / "upstream"
NXDI_PYTHON = ROOT / ".venv-nxdi" / "bin" / "python"
TAGS = {"context": "context_encoding_model", "token_generation": "token_generation_model"}


def _clip(value: float, low: int, high: int) -> int:
    return max(low, min(high, int(round(value))))


def seeded_traces(requests: int, seed: int) -> dict[str, Traffic]:
    rng = random.Random(seed)

    def chat() -> TrafficRecord:
        return TrafficRecord(_clip(rng.lognormvariate(math.log(180), 0.8), 20, 1000),
                             _clip(rng.lognormvariate(math.log(200), 0.7), 1, 1000))

    def rag() -> TrafficRecord:
        return TrafficRecord(_clip(rng.lognormvariate(math.log(1100), 0.35), 600, 2000),
                             _clip(rng.lognormvariate(math.log(150), 0.6), 1, 600))

    def bimodal() -> TrafficRecord:
        if rng.random() < 0.7:
            return TrafficRecord(_clip(rng.lognormvariate(math.log(60), 0.5), 20, 300),
                                 _clip(rng.lognormvariate(math.log(120), 0.6), 1, 600))
        return TrafficRecord(_clip(rng.gauss(3000, 600), 1500, 6000), _clip(rng.lognormvariate(math.log(300), 0.5),
                                                                            1, 1500))

    out = {name: Traffic(tuple(make() for _ in range(requests)), f"seeded {name} (seed {seed})", "jsonl")
           for name, make in (("chat", chat), ("rag", rag), ("bimodal", bimodal))}
    out["shared-prefix"] = read_traffic(SHARED_PREFIX)
    return out


def upstream_routes(jobs: list[dict]) -> list[list[int]]:
    """Every job's lengths routed by NxDI's own get_target_bucket (one worker process for all jobs)."""
    sources = [str(UPSTREAM / "neuronx-distributed-inference" / "src"), str(UPSTREAM / "neuronx-distributed" / "src")]
    with tempfile.TemporaryDirectory() as work:
        spec, out = Path(work) / "spec.json", Path(work) / "out.json"
        spec.write_text(json.dumps({"sys_path": sources, "jobs": jobs}))
        subprocess.run([str(NXDI_PYTHON), str(ROOT / "bench" / "_nxdi_routing.py"), str(spec), str(out)], check=True)
        return json.loads(out.read_text())


def main() -> None:
    parser = bench_parser("buckets_plan", __doc__)
    parser.add_argument("--requests", type=int, default=2000, help="requests per seeded trace")
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument("--make-shared-prefix-trace", type=Path, metavar="MODEL",
                        help="serve the shared-prefix bench's load with --request-log into "
                             "bench/traces/shared-prefix.jsonl")
    args = parser.parse_args()
    if args.make_shared_prefix_trace:
        return make_shared_prefix_trace(args.make_shared_prefix_trace, args.workdir)
    recipe = load_recipe(RECIPE)
    rules = framework_rules(recipe, "nxd")
    traces = seeded_traces(args.requests, args.seed)
    plans, jobs = {}, []
    for name, traffic in traces.items():
        equal = plan_from_traffic(traffic, recipe, "nxd")  # what `neuronpack buckets plan` prints
        half = plan_from_traffic(traffic, recipe, "nxd", max_graphs=equal.current.graphs // 2)
        demand = build_demand(traffic, rules)
        plans[name] = {"auto": equal.current, "planned": equal.planned, "planned, half the graphs": half.planned}
        for label, choice in plans[name].items():
            for kind, lengths in (("context", demand.context), ("token_generation", demand.token_generation)):
                jobs.append({"trace": name, "plan": label, "kind": kind, "tag": TAGS[kind],
                             "buckets": list(getattr(choice, kind)), "lengths": sorted(lengths)})
    routes = upstream_routes([{k: job[k] for k in ("tag", "buckets", "lengths")} for job in jobs])
    rows = _rows(traces, rules, plans, jobs, routes)
    _print(rows)
    payload = {"recipe": str(RECIPE.relative_to(ROOT)), "requests_per_seeded_trace": args.requests, "seed": args.seed,
               "routing": "neuronx_distributed_inference 0.9.0 ModelWrapper.get_target_bucket (../shared/upstream)",
               "rows": rows}
    path = save_results("buckets_plan", payload)
    _plot(rows)
    print(f"wrote {path.relative_to(ROOT)} and docs/bench/buckets_plan.png")


def _rows(traces, rules, plans, jobs, routes) -> list[dict]:
    by_key = {(j["trace"], j["plan"], j["kind"]): dict(zip(j["lengths"], r, strict=True))
              for j, r in zip(jobs, routes, strict=True)}
    rows = []
    for name, traffic in traces.items():
        demand = build_demand(traffic, rules)
        for label, choice in plans[name].items():
            ctx, tkg = by_key[(name, label, "context")], by_key[(name, label, "token_generation")]
            prompt = sum(w * (ctx[n] - n) for n, w in demand.context.items()) / demand.requests
            kv = sum(w * (tkg[n] - n) for n, w in demand.token_generation.items()) / demand.decode_steps
            # the planner's own routing model gave the same padding as upstream's function
            assert math.isclose(prompt, choice.padding.prompt_mean) and math.isclose(kv, choice.padding.kv_per_token)
            rows.append({"trace": name, "plan": label, "context": list(choice.context),
                         "token_generation": list(choice.token_generation), "graphs": choice.graphs,
                         "padded_prompt_tokens_per_request": round(prompt, 2),
                         "padded_kv_positions_per_generated_token": round(kv, 2), "requests": demand.requests})
    for row in rows:
        auto = next(r for r in rows if r["trace"] == row["trace"] and r["plan"] == "auto")
        row["prompt_padding_vs_auto"] = round(auto["padded_prompt_tokens_per_request"]
                                              / max(row["padded_prompt_tokens_per_request"], 1e-9), 2)
        row["kv_padding_vs_auto"] = round(auto["padded_kv_positions_per_generated_token"]
                                          / max(row["padded_kv_positions_per_generated_token"], 1e-9), 2)
    return rows


def _print(rows: list[dict]) -> None:
    print(f"{'trace':14} {'plan':26} {'graphs':>6} {'prompt pad/req':>15} {'x less':>7} {'KV pad/token':>13} "
          f"{'x less':>7}")
    for r in rows:
        print(f"{r['trace']:14} {r['plan']:26} {r['graphs']:>6} {r['padded_prompt_tokens_per_request']:>15.1f} "
              f"{r['prompt_padding_vs_auto']:>7.2f} {r['padded_kv_positions_per_generated_token']:>13.1f} "
              f"{r['kv_padding_vs_auto']:>7.2f}")


def _plot(rows: list[dict]) -> None:
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    labels = list(dict.fromkeys(r["plan"] for r in rows))
    with figure("buckets_plan", figsize=(11, 4), ncols=2) as (fig, axes):
        _bars(fig, axes, rows, traces, labels)


def _bars(fig, axes, rows: list[dict], traces: list[str], labels: list[str]) -> None:
    for ax, key, title in ((axes[0], "padded_prompt_tokens_per_request", "padded prompt tokens per request"),
                           (axes[1], "padded_kv_positions_per_generated_token", "padded KV positions per token")):
        width = 0.8 / len(labels)
        for i, label in enumerate(labels):
            values = [next(r[key] for r in rows if r["trace"] == t and r["plan"] == label) for t in traces]
            graphs = next(r["graphs"] for r in rows if r["plan"] == label)
            ax.bar([x + i * width for x in range(len(traces))], values, width, label=f"{label} ({graphs} graphs)")
        ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(traces))], traces)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle("NxDI buckets (Llama-3.1-8B recipe, 8192): auto vs planned from the trace, routed by NxDI itself")


def make_shared_prefix_trace(model: Path, workdir: Path, rounds: int = 3) -> None:
    """The shared-prefix bench's load (bench/peers_serve.py --shared-prefix: its batch-8 float32 artifact, a
    ~400-token system prompt, 16 questions, 64 tokens each, 8 at a time; ``rounds`` rounds) served by ``neuronpack
    serve --request-log``: the server's own log is the trace (its cached_tokens the prefix cache's hits, its batch
    the decode steps' mean, its timestamps)."""
    import asyncio

    from bench._common import free_port, start_serve_process
    from bench._shared_prefix import QUESTIONS, chat_round, system_prompt
    from bench.peers_serve import SHARED_CONTEXT, SHARED_SEQ_LEN, SLOTS, SYSTEM_TOKENS, compiled_artifact
    from bench.serve import stop_server

    workdir.mkdir(parents=True, exist_ok=True)
    artifact = compiled_artifact(model, "float32", workdir, SHARED_SEQ_LEN, SHARED_CONTEXT)
    log = workdir / "shared-prefix.jsonl"
    log.unlink(missing_ok=True)
    port = free_port()
    proc, _ = start_serve_process(artifact, port, ["--served-model-name", "smollm2", "--quiet", "--request-log",
                                                   str(log)])
    try:
        system = system_prompt(model, SYSTEM_TOKENS)
        for _ in range(rounds):
            asyncio.run(chat_round(port, SLOTS, system, QUESTIONS, 64))
    finally:
        stop_server(proc)  # the log's last lines are written and the file closed as the server ends
    SHARED_PREFIX.parent.mkdir(exist_ok=True)
    SHARED_PREFIX.write_text(log.read_text())
    print(f"wrote {SHARED_PREFIX.relative_to(ROOT)}: {len(read_traffic(SHARED_PREFIX).records)} requests")


if __name__ == "__main__":
    main()
