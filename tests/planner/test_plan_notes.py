"""What `buckets plan` tells beside its figures (planner/notes.py, run.py, graph_seconds.py): a budget it cannot
spend, the KV padding it trades for prompt padding (and --kv-weight to weigh it), planned trn1 context buckets that
run NxDI's flash-attention kernel at lengths nothing verified, and a compile budget divided by the seconds the
store's own artifacts recorded."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from neuronpack.planner.run import plan_buckets_command
from neuronpack.traffic import TrafficRecord
from tests.backends.neuron_standin import fixtures as standin

ROOT = Path(__file__).resolve().parents[2]
TRN1 = ROOT / "recipes" / "llama-3.1-8b-instruct-trn1.toml"
SHARED_PREFIX = ROOT / "bench" / "traces" / "shared-prefix.jsonl"
nxd_sdk, sdk_path = standin.nxd_sdk, standin.sdk_path  # fixtures


def write_traffic(path: Path, records: list[TrafficRecord]) -> Path:
    path.write_text("".join(r.to_json_line() + "\n" for r in records))
    return path


def chat(path: Path, count: int = 400, seed: int = 3) -> Path:
    """Prompts of 20-1000 tokens and completions of 1-1000 (lognormal), like bench/buckets_plan.py's chat trace."""
    rng = random.Random(seed)

    def clip(value: float, high: int) -> int:
        return max(1, min(high, round(value)))

    return write_traffic(path, [TrafficRecord(max(20, clip(rng.lognormvariate(math.log(180), 0.8), 1000)),
                                              clip(rng.lognormvariate(math.log(200), 0.7), 1000))
                                for _ in range(count)])


def test_a_budget_beyond_what_a_plan_spends_is_named():
    result = plan_buckets_command(SHARED_PREFIX, recipe=TRN1, max_graphs=1_000_000)
    planned = result.report.planned
    assert len(planned.token_generation) == 64 and planned.graphs < 1_000_000
    [note] = [n for n in result.report.notes if "more than a plan spends" in n]
    assert note == (f"a budget of 1000000 graphs is more than a plan spends: each kind gets at most 64 buckets "
                    f"(token_generation reached that), so the plan uses {planned.graphs} graphs")
    default = plan_buckets_command(SHARED_PREFIX, recipe=TRN1).report
    assert not any("more than a plan spends" in n for n in default.notes)


def test_the_kv_padding_a_tight_plan_trades_is_said_and_can_be_weighed(tmp_path):
    traffic = chat(tmp_path / "chat.jsonl")
    tight = plan_buckets_command(traffic, recipe=TRN1, max_graphs=7).report
    now, new = tight.current.padding.kv_per_token, tight.planned.padding.kv_per_token
    assert new > now  # the cost model's 0.002 per KV position favours prompts
    [note] = [n for n in tight.notes if "KV positions per generated token" in n]
    assert f"the plan pads {new / now:.1f}x the KV positions per generated token of the current one" in note
    assert "one padded KV position weighs 0.00201 of a padded prompt token" in note and "--kv-weight" in note
    weighed = plan_buckets_command(traffic, recipe=TRN1, max_graphs=7, kv_weight=0.5).report
    assert weighed.cost.kv_weight == 0.5 and weighed.cost.shape_from.startswith("--kv-weight; Llama-3.1-8B")
    assert weighed.planned.padding.kv_per_token < new and len(weighed.planned.token_generation) > len(
        tight.planned.token_generation)


def test_trn1_context_buckets_in_the_flash_attention_range_are_named_unverified(tmp_path):
    """get_flash_attention_strategy at LNC 1 (trn1) from 4096 tokens: planned buckets there at lengths NxDI's own
    buckets never take are flagged; with the kernel turned off, or at LNC 2 (trn2), nothing is."""
    rng = random.Random(5)
    traffic = write_traffic(tmp_path / "long.jsonl", [TrafficRecord(rng.randint(4200, 6000), 16) for _ in range(200)])
    report = plan_buckets_command(traffic, recipe=TRN1).report
    flagged = [b for b in report.planned.context if b >= 4096 and b & (b - 1)]
    assert flagged
    [note] = [n for n in report.notes if "flash-attention" in n]
    assert note.startswith(f"context buckets {', '.join(map(str, flagged))} run NxD Inference's unsharded "
                           "flash-attention kernel (get_flash_attention_strategy at LNC 1: lengths from 4096)")
    assert note.endswith("unverified") and "aws-neuron/nki-library, branch 2.29_release" in note
    off = plan_buckets_command(traffic, recipe=TRN1, overrides=["neuron_overrides.attn_kernel_enabled=false"])
    assert not any("flash-attention" in n for n in off.report.notes)
    trn2 = plan_buckets_command(traffic, recipe=TRN1, overrides=['target.instance="trn2"'])
    assert not any("flash-attention" in n for n in trn2.report.notes)


TINY_NXD = ["target.framework=nxd", "target.instance=inf2", "target.tp_degree=2", "target.batch_size=2",
            "target.seq_len=256", "target.max_context_length=128", "model.dtype=float32"]


def test_a_compile_budget_divides_by_the_seconds_the_stores_artifacts_recorded(tiny_llama, tmp_path, nxd_sdk):
    """--compile-budget without --graph-seconds: the nxd artifact built here records graphs.seconds, and its recipe
    says how many graphs that compile made (context + token-generation buckets at batch 1)."""
    from neuronpack.pipeline import compile_model

    root = tmp_path / "root"
    built = compile_model(str(tiny_llama), overrides=TINY_NXD, out_root=root)
    seconds = built.manifest.graphs["seconds"]
    graphs = len(built.manifest.buckets.context) + len(built.manifest.buckets.token_generation)
    traffic = write_traffic(tmp_path / "t.jsonl", [TrafficRecord(40 + i, 8) for i in range(20)])
    result = plan_buckets_command(traffic, overrides=TINY_NXD, compile_budget=1000 * seconds,
                                  model=tiny_llama, store=root / "neuron-compiled-artifacts")
    recorded = result.graph_seconds
    assert recorded.artifacts == (built.key,) and recorded.same_model
    assert recorded.seconds == pytest.approx(seconds / graphs, abs=1e-3)
    assert result.report.budget == math.floor(1000 * seconds / recorded.seconds)
    assert result.to_dict()["graph_seconds_recorded"]["artifacts"] == [built.key]
    assert "over 1 artifact of this model's shape" in recorded.describe()


def test_the_docs_planned_rows_are_what_the_command_prints():
    """docs/buckets.md's figures table (from docs/bench/buckets_plan.json): its "planned" rows are the plan `buckets
    plan` prints for that trace and recipe (the default budget, split by the planner), padding included."""
    import json
    import re

    from bench.buckets_plan import RECIPE, seeded_traces
    from neuronpack.planner.plan import plan_from_traffic
    from neuronpack.recipe import load_recipe

    results = json.loads((ROOT / "docs" / "bench" / "buckets_plan.json").read_text())
    traces = seeded_traces(results["requests_per_seeded_trace"], results["seed"])
    table = re.findall(r"^\| *\| planned \| (\d+) \| ([\d.]+) \| [\d.]+ \| ([\d.]+) \|",
                       (ROOT / "docs" / "buckets.md").read_text(), flags=re.M)
    rows = [r for r in results["rows"] if r["plan"] == "planned"]
    assert len(table) == len(rows) == 4
    for row, (graphs, prompt, kv) in zip(rows, table, strict=True):
        planned = plan_from_traffic(traces[row["trace"]], load_recipe(RECIPE), "nxd").planned
        assert (list(planned.context), list(planned.token_generation)) == (row["context"], row["token_generation"])
        assert int(graphs) == planned.graphs  # one decimal, rounded from the JSON's two
        assert (float(prompt), float(kv)) == pytest.approx((planned.padding.prompt_mean, planned.padding.kv_per_token),
                                                           abs=0.1)
