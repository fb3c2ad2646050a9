"""The seconds one graph takes to compile, as the store's artifacts recorded it: what ``buckets plan
--compile-budget`` divides by when ``--graph-seconds`` is not given.

A build records the compile its graphs cost (the manifest's ``graphs.seconds``: where first built, a donor's figure
carried over); that artifact's graph count follows from its own recipe by the framework's rules (frameworks.py). The
figure used is the median of ``graphs.seconds / graphs`` over the store's artifacts of the framework, those of the
planned model's shape when there are any (compile time grows with the model), else all of the framework's.

Example::

    found = recorded_graph_seconds(artifacts_root(None), "nxd", model_config)
    found.seconds, found.describe()     # 312.4, "312.4 s a graph: the median of 3 nxd artifacts in ..."
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from neuronpack.artifacts.verify import quick_check
from neuronpack.errors import BucketError, NeuronpackError
from neuronpack.planner.frameworks import framework_rules

# the model's shape, as far as compile time goes (cost.py reads the same keys)
SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "vocab_size")


@dataclass(frozen=True)
class GraphSeconds:
    seconds: float  # one graph's compile
    artifacts: tuple[str, ...]  # the keys it comes from, newest first
    same_model: bool  # from artifacts of the planned model's shape
    store: Path

    def describe(self) -> str:
        which = "of this model's shape" if self.same_model else "(of other models: pass --model or --graph-seconds)"
        return (f"{self.seconds:.1f} s a graph: the median of graphs.seconds / graphs over {len(self.artifacts)} "
                f"{'artifact' if len(self.artifacts) == 1 else 'artifacts'} {which} in {self.store} (newest "
                f"{self.artifacts[0][:16]})")

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "artifacts": list(self.artifacts), "same_model": self.same_model,
                "store": str(self.store)}


def recorded_graph_seconds(store: Path, framework: str, model_config: dict | None) -> GraphSeconds:
    """One graph's compile seconds from the ``framework`` artifacts in ``store`` (see the module docstring);
    BucketError when none records them."""
    found = []  # (created_at, key, seconds a graph, same shape)
    for path in sorted(Path(store).iterdir()) if Path(store).is_dir() else ():
        manifest = None if path.name.startswith(".") else quick_check(path)
        if manifest is None or manifest.framework != framework or not manifest.graphs:
            continue
        per_graph = _per_graph(manifest)
        if per_graph is not None:
            found.append((manifest.created_at or "", manifest.key, per_graph,
                          _same_shape(manifest.model.config, model_config)))
    if not found:
        raise BucketError(f"--compile-budget needs the seconds one graph takes to compile, and no {framework} "
                          f"artifact in {store} records them", where="--compile-budget",
                          fix="pass --graph-seconds S (a compile's seconds / its graphs), or --root with the store "
                              "of an earlier build")
    chosen = [f for f in found if f[3]] or found
    chosen.sort(reverse=True)
    return GraphSeconds(round(statistics.median(f[2] for f in chosen), 3), tuple(f[1] for f in chosen),
                        bool(chosen[0][3]), Path(store))


def _per_graph(manifest) -> float | None:
    seconds = manifest.graphs.get("seconds")
    if not isinstance(seconds, int | float) or not seconds > 0:
        return None
    try:
        rules = framework_rules(manifest.recipe, manifest.framework)
    except NeuronpackError:  # a recipe this planner cannot plan: no figure to trust
        return None
    graphs = rules.graphs(len(rules.context.current), len(rules.token_generation.current), len(rules.batch.current))
    return float(seconds) / graphs if graphs else None


def _same_shape(recorded: dict, planned: dict | None) -> bool:
    return planned is not None and all(recorded.get(k) == planned.get(k) for k in SHAPE_KEYS)
