"""``neuronpack buckets plan``: the buckets that pad a request log least within a graph budget, beside the recipe's.

Each dimension's best plan for every bucket count comes from the exact partition (partition.py); the budget is then
split between the dimensions by trying every combination of counts that fits it, the cost of a combination being
the padding of all three in prompt-token equivalents (cost.py).

Example::

    report = plan_from_traffic(read_traffic(Path("requests.jsonl")), load_recipe(Path("r.toml")), "nxd")
    report.planned.context, report.planned.graphs, report.current.padding.prompt_mean
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from neuronpack.errors import BucketError
from neuronpack.planner.cost import CostModel, cost_model
from neuronpack.planner.demand import Demand, Padding, build_demand, measure
from neuronpack.planner.frameworks import Dimension, FrameworkRules, framework_rules
from neuronpack.planner.notes import plan_notes
from neuronpack.planner.partition import Partition, optimal_partitions, padding_of
from neuronpack.recipe import Recipe
from neuronpack.traffic import Traffic

MAX_BUCKETS = 64  # per dimension: more graphs than any Neuron compile would take


@dataclass(frozen=True)
class BucketChoice:
    context: tuple[int, ...]
    token_generation: tuple[int, ...]
    batch: tuple[int, ...]
    graphs: int
    cost: float  # padding per request, in prompt-token equivalents (cost.py)
    padding: Padding
    compile_seconds: float | None

    def to_dict(self) -> dict:
        return {"context": list(self.context), "token_generation": list(self.token_generation),
                "batch": list(self.batch), "graphs": self.graphs, "cost_per_request": round(self.cost, 3),
                "padding": self.padding.to_dict(), "compile_seconds": self.compile_seconds}


@dataclass(frozen=True)
class PlanReport:
    framework: str
    requests: int
    decode_steps: int
    cost: CostModel
    budget: int
    current: BucketChoice
    planned: BucketChoice
    planned_dimensions: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {"framework": self.framework, "requests": self.requests, "decode_steps": self.decode_steps,
                "cost_model": self.cost.to_dict(), "max_graphs": self.budget, "current": self.current.to_dict(),
                "planned": self.planned.to_dict(), "planned_dimensions": list(self.planned_dimensions),
                "notes": list(self.notes)}


def plan_from_traffic(traffic: Traffic, recipe: Recipe, framework: str, *, max_graphs: int | None = None,
                      graph_seconds: float | None = None, model_config: dict | None = None,
                      model_source: str = "", counts: tuple[int, int, int] | None = None,
                      kv_weight: float | None = None) -> PlanReport:
    """Plan ``recipe``'s buckets for ``traffic`` under ``framework``'s rules: within ``max_graphs`` graphs (default:
    as many as the recipe compiles today), or with exactly ``counts`` = (context, token-generation, batch) buckets.
    ``kv_weight`` replaces the cost model's weight of a padded KV position (in padded prompt tokens).
    BucketError when no plan fits the budget; TrafficError for a request past the recipe's limits."""
    rules = framework_rules(recipe, framework)
    demand = build_demand(traffic, rules)
    cost = cost_model(model_config, recipe.model.dtype, model_source)
    if kv_weight is not None:
        cost = dataclasses.replace(cost, kv_weight=kv_weight,
                                   shape_from=f"--kv-weight; {cost.shape_from} would give {cost.kv_weight:.3g}")
    dims = _dimensions(rules, demand)
    current = _choice(traffic, rules, demand, cost, tuple(d.current for d in dims), graph_seconds)
    budget = max_graphs if max_graphs is not None else current.graphs
    limits = counts or (budget,) * 3
    curves = [_curve(d, weights, limit, planned) for d, weights, planned, limit
              in zip(dims, _weights(demand), _planned(dims, demand), limits, strict=True)]
    best = (None, tuple(c[-1].buckets for c in curves)) if counts is not None else None
    for combo in itertools.product(*curves) if counts is None else ():
        lists = tuple(p.buckets for p in combo)
        graphs = rules.graphs(*map(len, lists))
        if graphs <= budget and (best is None or (_objective(combo, demand, cost), graphs) < best[0]):
            best = ((_objective(combo, demand, cost), graphs), lists)
    if best is None:
        fewest = rules.graphs(*(len(c[0].buckets) for c in curves))
        raise BucketError(f"a budget of {budget} graphs fits no plan: {framework} needs at least {fewest}",
                          where="--max-graphs / --compile-budget",
                          fix=f"allow at least {fewest} graphs (one bucket per kind, at its maximum)")
    planned = _choice(traffic, rules, demand, cost, best[1], graph_seconds)
    names = tuple(d.name for d, p in zip(dims, _planned(dims, demand), strict=True) if p)
    # the partition stops at MAX_BUCKETS per kind: a larger budget is not all spent, which the notes say
    capped = tuple(d.name for d, c, p in zip(dims, curves, _planned(dims, demand), strict=True)
                   if p and counts is None and budget > MAX_BUCKETS and len(c) == MAX_BUCKETS)
    notes = plan_notes(rules, demand, traffic, current=current.padding, planned=planned.padding,
                       planned_context=planned.context, planned_graphs=planned.graphs, cost=cost, budget=budget,
                       capped=capped, cap=MAX_BUCKETS)
    return PlanReport(framework, demand.requests, demand.decode_steps, cost, budget, current, planned, names, notes)


# --- private ---------------------------------------------------------------------------------------------------------
def _dimensions(rules: FrameworkRules, demand: Demand) -> tuple[Dimension, Dimension, Dimension]:
    return rules.context, rules.token_generation, rules.batch


def _weights(demand: Demand) -> tuple[dict, dict, dict]:
    return demand.context, demand.token_generation, demand.batch


def _planned(dims: tuple[Dimension, ...], demand: Demand) -> tuple[bool, ...]:
    return tuple(d.planned and bool(w) for d, w in zip(dims, _weights(demand), strict=True))


def _curve(dim: Dimension, weights: dict, budget: int, planned: bool) -> list[Partition]:
    """The best plan of each bucket count up to ``budget`` (index k - 1); a dimension not planned keeps its list."""
    if not planned:
        return [Partition(dim.current, padding_of(dim.current, weights, strict=dim.strict) if weights else 0)]
    plans = optimal_partitions(weights, maximum=dim.maximum, max_buckets=max(1, min(budget, MAX_BUCKETS)),
                               strict=dim.strict, round_up=dim.round_up)
    return plans


def _objective(combo: tuple[Partition, ...], demand: Demand, cost: CostModel) -> float:
    context, kv, rows = (p.padding for p in combo)
    return (context + cost.kv_weight * (kv + demand.mean_kv_length * rows)) / demand.requests


def _choice(traffic: Traffic, rules: FrameworkRules, demand: Demand, cost: CostModel,
            lists: tuple[tuple[int, ...], ...], graph_seconds: float | None) -> BucketChoice:
    dims = _dimensions(rules, demand)
    combo = tuple(Partition(b, padding_of(b, w, strict=d.strict) if w else 0)
                  for b, w, d in zip(lists, _weights(demand), dims, strict=True))
    graphs = rules.graphs(*map(len, lists))
    seconds = round(graphs * graph_seconds, 1) if graph_seconds is not None else None
    return BucketChoice(*lists, graphs, _objective(combo, demand, cost), measure(traffic, rules, *lists), seconds)
