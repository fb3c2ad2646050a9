"""What ``neuronpack buckets plan`` does, as one call: read the log and the recipe, plan, and write or print.

Example::

    result = plan_buckets_command(Path("requests.jsonl"), recipe=Path("recipes/mine.toml"), max_graphs=10)
    result.report.planned.context, result.set_lines, result.written
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from neuronpack.errors import BucketError, CheckpointError, RecipeError
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

    def to_dict(self) -> dict:
        return {**self.report.to_dict(), "settings": self.settings, "set_lines": self.set_lines,
                "written": str(self.written) if self.written else None}


def plan_buckets_command(traffic: Path, *, recipe: Path | None = None, overrides: list[str] = (),
                         framework: str | None = None, max_graphs: int | None = None,
                         compile_budget: float | None = None, graph_seconds: float | None = None,
                         model: Path | None = None, write: bool = False) -> PlanResult:
    """Plan the recipe's buckets for the request log ``traffic``; with ``write``, into the recipe file."""
    if write and recipe is None:
        raise RecipeError("--write needs the recipe to write into", where="--write", fix="pass --recipe FILE")
    if write and overrides:
        raise RecipeError("--write with --set would write a plan made for settings the recipe does not have",
                          where="--set", fix="edit the recipe first, or print the plan's --set lines without --write")
    budget = _budget(max_graphs, compile_budget, graph_seconds)
    loaded = load_recipe(recipe, overrides=overrides)
    chosen = framework or loaded.target.framework
    if chosen == "auto":
        raise RecipeError("the recipe's framework is auto: the buckets depend on which one", where="target.framework",
                          fix="pass --framework nxd, tnx, vneuron or torch")
    config, source = _model_config(model, loaded.model.source)
    records = read_traffic(traffic)
    report = plan_from_traffic(records, loaded, chosen, max_graphs=budget, graph_seconds=graph_seconds,
                               model_config=config, model_source=source)
    settings = plan_settings(report, loaded)
    written = write_recipe(recipe, settings, framework=chosen) if write and settings else None
    return PlanResult(report, settings, set_lines(settings), written)


# --- private ---------------------------------------------------------------------------------------------------------
def _budget(max_graphs: int | None, compile_budget: float | None, graph_seconds: float | None) -> int | None:
    if max_graphs is not None and compile_budget is not None:
        raise BucketError("give either --max-graphs or --compile-budget", where="--compile-budget",
                          fix="drop one of the two")
    if compile_budget is None:
        return max_graphs
    if graph_seconds is None:
        raise BucketError("--compile-budget needs the seconds one graph takes to compile", where="--compile-budget",
                          fix="pass --graph-seconds S (from a compile of this model: its seconds / its graphs)")
    return math.floor(compile_budget / graph_seconds)


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
