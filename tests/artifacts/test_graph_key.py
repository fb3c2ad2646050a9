"""The graph key never serves a wrong graph: any change of a graph input (config field, tensor name / dtype / shape,
recipe field, bucket, version, target, neuronpack source that builds the graphs) gives another graph key; a change
of weight values only (file digests, tokenizer files, adapter names and bytes, serving-only fields) keeps it.

The spec is written here, apart from the code: which key inputs are values only (VALUE_ONLY)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuronpack.artifacts import graph_key as G
from neuronpack.pipeline.inputs import resolve_inputs
from neuronpack.pipeline.plan import plan_build
from neuronpack.progress import NullReporter
from tests.pipeline.builds import RECIPE

# key-input paths whose leaves are weight values or serving-only, per framework (everything else is a graph input)
VALUE_ONLY = {
    "torch": [("model", "weights", "files"), ("draft", "weights", "files"), ("aux_files",),
              ("compile", "lora", "adapters"), ("compile", "sampling")],
}
HYPOTHESIS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _plan(model: Path, root: Path):
    inputs = resolve_inputs(str(model), recipe_path=RECIPE, overrides=["compiler=export"], framework=None,
                            reporter=NullReporter())
    return plan_build(inputs, out_root=root, dest=None)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    from tests.helpers.tiny_models import make_tiny_checkpoint

    model = make_tiny_checkpoint(tmp_path_factory.mktemp("gk") / "llama", max_shard_size="40KB")
    return _plan(model, tmp_path_factory.mktemp("gk-root"))


def _graph_key(key_inputs, plan, code: str | None = None) -> str:
    return G.compute_graph_key(G.graph_key_inputs(key_inputs, code=code or plan.graph_key_inputs["code"],
                                                  ignore=plan.inputs.backend.graph_key_ignores))


def _leaves(data, path=()):
    if isinstance(data, dict) and data:
        for k, v in data.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(data, list) and data:
        for i, v in enumerate(data):
            yield from _leaves(v, (*path, i))
    else:
        yield path, data


def _changed(value, n: int):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + n
    if isinstance(value, str):
        return value + "x" * n
    if value is None:
        return n
    return [*value, n] if isinstance(value, list) else {**value, f"new{n}": n}


def _set(data, path, value):
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def test_the_derived_key_is_stable_and_differs_from_the_artifact_key(plan):
    assert plan.graph_key == _graph_key(plan.key_inputs, plan) != plan.key
    inputs = plan.graph_key_inputs
    assert "files" not in inputs["model"] and "aux_files" not in inputs  # the weights' bytes, the tokenizer
    assert inputs["model"]["tensors"] == plan.key_inputs["model"]["weights"]["tensors"]


@HYPOTHESIS
@given(data=st.data())
def test_every_leaf_change_moves_the_graph_key_unless_it_is_a_value(plan, data):
    leaves = list(_leaves(plan.key_inputs))
    path, value = data.draw(st.sampled_from(leaves), label="leaf")
    n = data.draw(st.integers(1, 5), label="n")
    changed = copy.deepcopy(plan.key_inputs)
    _set(changed, path, _changed(value, n))
    value_only = any(path[:len(p)] == p for p in VALUE_ONLY["torch"])
    assert (_graph_key(changed, plan) == plan.graph_key) is value_only, path


@HYPOTHESIS
@given(section=st.sampled_from(["config", "tensors"]), name=st.text(min_size=1, max_size=12))
def test_a_new_config_key_or_tensor_is_another_graph_key(plan, section, name):
    changed = copy.deepcopy(plan.key_inputs)
    if section == "config":
        changed["model"]["config"][f"added_{name}"] = 1
    else:
        changed["model"]["weights"]["tensors"].append([f"added.{name}", "F32", [2]])
    assert _graph_key(changed, plan) != plan.graph_key


def test_an_unknown_key_input_is_refused(plan):
    with pytest.raises(ValueError, match="does not know the key input"):
        _graph_key({**plan.key_inputs, "something_new": 1}, plan)


def test_resharded_weights_are_another_artifact_but_the_same_graphs(plan, tmp_path):
    from tests.helpers.tiny_models import make_tiny_checkpoint

    one_file = make_tiny_checkpoint(tmp_path / "one")  # the same seed and values, one shard instead of several
    other = _plan(one_file, tmp_path / "root")
    assert other.key != plan.key and other.graph_key == plan.graph_key


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory):
    dest = tmp_path_factory.mktemp("pkg") / "neuronpack"
    shutil.copytree(G._PACKAGE, dest, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return dest


@HYPOTHESIS
@given(data=st.data())
def test_a_changed_source_of_the_graphs_is_another_code_digest(package_copy, monkeypatch, data):
    monkeypatch.setattr(G, "_PACKAGE", package_copy)
    before = {fw: G.code_digest(fw) for fw in G.GRAPH_SOURCES}
    sources = sorted({p for fw in G.GRAPH_SOURCES for pattern in G.GRAPH_SOURCES[fw]
                      for p in package_copy.glob(pattern) if p.is_file()})
    path: Path = data.draw(st.sampled_from(sources), label="file")
    original = path.read_bytes()
    try:
        path.write_bytes(original + b"\n# changed\n")
        after = {fw: G.code_digest(fw) for fw in G.GRAPH_SOURCES}
    finally:
        path.write_bytes(original)
    for fw, patterns in G.GRAPH_SOURCES.items():
        in_sources = any(path in package_copy.glob(p) for p in patterns)
        assert (after[fw] != before[fw]) is in_sources, (fw, path)


def test_a_runtime_change_keeps_the_torch_graphs(package_copy, monkeypatch):
    monkeypatch.setattr(G, "_PACKAGE", package_copy)
    before = G.code_digest("torch")
    server = next(package_copy.glob("runtime/**/server.py"))
    original = server.read_bytes()
    try:
        server.write_bytes(original + b"\n# changed\n")
        assert G.code_digest("torch") == before
    finally:
        server.write_bytes(original)
