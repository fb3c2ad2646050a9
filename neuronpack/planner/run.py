"""What ``neuronpack buckets plan`` does, as one call: read the log and the recipe, plan, and write or print.

Example::

    result = plan_buckets_command(Path("requests.jsonl"), recipe=Path("recipes/mine.toml"), max_graphs=10)
    result.report.planned.context, result.set_lines, result.written

A compile budget in seconds becomes a graph budget by the seconds one graph takes: ``graph_seconds``, else what the
store's artifacts recorded (graph_seconds.py). Budgets must be finite numbers (a NaN or an infinity is refused, as
is a budget worth more graphs than an integer holds).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from neuronpack.artifacts.store import artifacts_root
from neuronpack.errors import BucketError, CheckpointError, RecipeError
from neuronpack.planner.graph_seconds import GraphSeconds, recorded_graph_seconds
from neuronpack.planner.plan import PlanReport, plan_from_traffic
from neuronpack.planner.recipe_edit import plan_settings, set_lines, write_recipe
from neuronpack.recipe import load_recipe
from neuronpack.traffic import read_traffic


@dataclass(frozen=True)
class PlanResult:
    report: PlanReport
    settings: dict
    set_lines: list[str]
    written: Path | None
    graph_seconds: GraphSeconds | None = None  # read from the store (--compile-budget without --graph-seconds)

    def to_dict(self) -> dict:
        recorded = self.graph_seconds.to_dict() if self.graph_seconds else None
        return {**self.report.to_dict(), "settings": self.settings, "set_lines": self.set_lines,
                "written": str(self.written) if self.written else None, "graph_seconds_recorded": recorded}


def plan_buckets_command(traffic: Path, *, recipe: Path | None = None, overrides: list[str] = (),
                         framework: str | None = None, max_graphs: int | None = None,
                         compile_budget: float | None = None, graph_seconds: float | None = None,
                         model: Path | None = None, write: bool = False, kv_weight: float | None = None,
                         store: Path | None = None) -> PlanResult:
    """Plan the recipe's buckets for the request log ``traffic``; with ``write``, into the recipe file.
    ``kv_weight``: one padded KV position in padded prompt tokens, instead of the cost model's; ``store``: where
    recorded graph seconds are looked up (``--compile-budget`` without ``graph_seconds``)."""
    if write and recipe is None:
        raise RecipeError("--write needs the recipe to write into", where="--write", fix="pass --recipe FILE")
    if write and overrides:
        raise RecipeError("--write with --set would write a plan made for settings the recipe does not have",
                          where="--set", fix="edit the recipe first, or print the plan's --set lines without --write")
    _check_numbers(max_graphs=max_graphs, compile_budget=compile_budget, graph_seconds=graph_seconds,
                   kv_weight=kv_weight)
    if max_graphs is not None and compile_budget is not None:
        raise BucketError("give either --max-graphs or --compile-budget", where="--compile-budget",
                          fix="drop one of the two")
    loaded = load_recipe(recipe, overrides=overrides)
    chosen = framework or loaded.target.framework
    if chosen == "auto":
        raise RecipeError("the recipe's framework is auto: the buckets depend on which one", where="target.framework",
                          fix="pass --framework nxd, tnx, vneuron or torch")
    config, source = _model_config(model, loaded.model.source)
    recorded = None
    if compile_budget is not None and graph_seconds is None:
        recorded = recorded_graph_seconds(store or artifacts_root(None), chosen, config)
        graph_seconds = recorded.seconds
    budget = max_graphs if compile_budget is None else _graph_budget(compile_budget, graph_seconds)
    records = read_traffic(traffic)
    report = plan_from_traffic(records, loaded, chosen, max_graphs=budget, graph_seconds=graph_seconds,
                               model_config=config, model_source=source, kv_weight=kv_weight)
    settings = plan_settings(report, loaded)
    written = write_recipe(recipe, settings, framework=chosen) if write and settings else None
    return PlanResult(report, settings, set_lines(settings), written, recorded)


# --- private ---------------------------------------------------------------------------------------------------------
def _check_numbers(**values: float | None) -> None:
    """Every given budget figure is a finite number above zero (the compile budget may be 0: no graph fits)."""
    for name, value in values.items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if not math.isfinite(value):
            unit = {"max_graphs": "graphs", "kv_weight": "padded prompt tokens"}.get(name, "seconds")
            raise BucketError(f"{flag} {value} is not a finite number", where=flag, fix=f"give a number of {unit}")
        if value < 0 or (value == 0 and name != "compile_budget"):
            raise BucketError(f"{flag} {value:g} must be above zero", where=flag, fix="give a positive number")


def _graph_budget(compile_budget: float, graph_seconds: float) -> int:
    """How many graphs ``compile_budget`` seconds compile, at ``graph_seconds`` each."""
    graphs = compile_budget / graph_seconds
    if not graphs < sys.maxsize:  # 1e308 / 0.001 is infinite: no plan is that large, and no integer holds it
        raise BucketError(f"--compile-budget {compile_budget:g} at {graph_seconds:g} s a graph is more graphs than a "
                          "budget can count", where="--compile-budget",
                          fix="give the seconds a compile may really take (3600 is an hour), or --max-graphs N")
    return math.floor(graphs)


def _model_config(model: Path | None, source: str | None) -> tuple[dict | None, str]:
    """config.json of ``--model``, else of the recipe's model.source when that is a local directory."""
    candidates = [Path(model)] if model is not None else ([Path(source)] if source else [])
    for directory in candidates:
        path = directory / "config.json"
        if not path.is_file():
            if model is not None:
                raise CheckpointError("no config.json in --model", where=str(model),
                                      fix="pass the model's checkpoint directory")
            continue
        try:
            return json.loads(path.read_text()), str(path)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"unreadable config.json: {exc}", where=str(path),
                                  fix="pass a checkpoint with a valid config.json") from None
    return None, ""
