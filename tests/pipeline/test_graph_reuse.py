"""Compile once per graph: a checkpoint whose weights differ only in value takes a published artifact's compiled graphs
(same graph key), builds only its weights, and stands alone (verify / gc / push of either never breaks the other).

Export-only graphs here (fast); the AOTInductor path with tokens against transformers is
tests/backends/test_torch_aot_reuse.py, the Neuron frameworks are held to upstream in their own tests.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from neuronpack.artifacts.listing import plan_gc, run_gc
from neuronpack.artifacts.manifest import read_manifest
from neuronpack.pipeline import compile_model, verify_artifact
from tests.helpers.tiny_models import fine_tune_copy
from tests.pipeline.builds import FAST, RECIPE


@pytest.fixture(scope="module")
def donor(tmp_path_factory, tiny_llama):
    """The tiny model compiled once into a root of its own (the donor of every reuse below)."""
    root = tmp_path_factory.mktemp("reuse-root")
    return compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=root), root


def _fine_tune(tiny_llama: Path, tmp_path: Path, seed: int = 1) -> Path:
    return fine_tune_copy(tiny_llama, tmp_path / f"fine-tune-{seed}", seed=seed)


def test_a_fine_tune_takes_the_donors_graphs_and_builds_only_its_weights(donor, tiny_llama, tmp_path):
    built, root = donor
    tuned = _fine_tune(tiny_llama, tmp_path)
    result = compile_model(str(tuned), recipe=RECIPE, overrides=FAST, out_root=root)
    assert not result.cache_hit and result.key != built.key
    assert result.graphs_from["key"] == built.key and result.graphs_from["files"] == 1
    assert result.graphs_from["compile_seconds_saved"] == built.manifest.graphs["seconds"] > 0
    graphs = result.manifest.graphs
    assert graphs["key"] == built.manifest.graphs["key"] and graphs["from"]["key"] == built.key
    assert "bucket_seconds" not in result.manifest.build  # nothing was compiled
    # the graphs are the donor's file (a hard link: one inode), the weights this checkpoint's own
    assert (result.path / "graphs.pt2").stat().st_ino == (built.path / "graphs.pt2").stat().st_ino
    mine = {f.path: f.sha256 for f in result.manifest.files}
    theirs = {f.path: f.sha256 for f in built.manifest.files}
    assert mine["graphs.pt2"] == theirs["graphs.pt2"]
    assert mine["weights/model.safetensors"] != theirs["weights/model.safetensors"]
    assert result.manifest.key_inputs["model"]["weights"]["tensors"] == built.manifest.key_inputs["model"][
        "weights"]["tensors"]
    assert verify_artifact(result.path).key == result.key


def test_the_reused_artifact_stands_alone_when_the_donor_is_collected(tiny_llama, tmp_path):
    root = tmp_path / "root"
    first = compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=root)
    second = compile_model(str(_fine_tune(tiny_llama, tmp_path)), recipe=RECIPE, overrides=FAST, out_root=root)
    assert second.graphs_from["key"] == first.key
    items = [i for i in plan_gc(root / "neuron-compiled-artifacts", keep=1) if i.kind == "artifact"]
    assert [i.path.name for i in items] == [first.key]  # the older one goes
    run_gc(items)
    assert not first.path.exists()
    assert verify_artifact(second.path).key == second.key
    from neuronpack.backends.torch_aot import load_artifact

    lm = load_artifact(second.path)  # its graphs load without the donor
    assert lm.batch_size == 2


def test_no_reuse_compiles_every_graph(donor, tiny_llama, tmp_path):
    built, root = donor
    result = compile_model(str(_fine_tune(tiny_llama, tmp_path, seed=2)), recipe=RECIPE, overrides=FAST,
                           out_root=root, reuse=False)
    assert result.graphs_from is None and result.manifest.graphs["from"] is None
    assert result.manifest.build["bucket_seconds"]
    assert result.manifest.graphs["key"] == built.manifest.graphs["key"]  # the same graph key, compiled anyway
    assert (result.path / "graphs.pt2").stat().st_ino != (built.path / "graphs.pt2").stat().st_ino


def test_force_rebuilds_every_graph_unless_reuse_is_asked(donor, tiny_llama, tmp_path):
    """A forced rebuild is from scratch: the donor a plain build would take is not consulted, the graphs are
    compiled here (another inode), unless --reuse says otherwise. Through the CLI, as a user forces it."""
    import subprocess
    import sys

    built, root = donor
    tuned = _fine_tune(tiny_llama, tmp_path, seed=5)
    args = [sys.executable, "-m", "neuronpack", "compile", str(tuned), "--recipe", str(RECIPE), "--set",
            "compiler=export", "--out-root", str(root), "--progress", "plain", "--format", "json"]
    first = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
    assert first["graphs_from"] is not None  # no --force: a donor's graphs (the root's newest of the graph key)
    forced = subprocess.run([*args, "--force"], capture_output=True, text=True, check=True)
    summary = json.loads(forced.stdout)
    assert summary["key"] == first["key"] and summary["graphs_from"] is None and not summary["cache_hit"]
    assert "--force: every graph is compiled here (--reuse takes them" in forced.stderr
    assert "reusing" not in forced.stderr
    graphs = Path(summary["path"]) / "graphs.pt2"
    donor_graphs = root / "neuron-compiled-artifacts" / first["graphs_from"]["key"] / "graphs.pt2"
    assert graphs.stat().st_ino != donor_graphs.stat().st_ino
    assert json.loads((Path(summary["path"]) / "neuronpack.json").read_text())["graphs"]["from"] is None
    again = json.loads(subprocess.run([*args, "--force", "--reuse"], capture_output=True, text=True,
                                      check=True).stdout)
    assert again["graphs_from"] is not None and again["key"] == first["key"]


@pytest.mark.parametrize("change", [
    ["target.batch_size=3"],  # a recipe field a graph is compiled for
    ["buckets.context=[16, 32]"],  # the bucket plan (its largest bucket bounds the prefill graph)
])
def test_a_graph_input_that_differs_compiles_again(donor, tiny_llama, change):
    built, root = donor
    result = compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST + change, out_root=root)
    assert result.graphs_from is None
    assert result.manifest.graphs["key"] != built.manifest.graphs["key"]


def test_another_shape_is_another_graph_key(donor, make_checkpoint):
    built, root = donor
    other = make_checkpoint(layers=3)  # one more layer: another tensor list
    result = compile_model(str(other), recipe=RECIPE, overrides=FAST, out_root=root)
    assert result.graphs_from is None and result.manifest.graphs["key"] != built.manifest.graphs["key"]


def test_serving_only_fields_and_tokenizer_files_keep_the_graph_key(donor, tiny_llama, tmp_path):
    built, root = donor
    tuned = _fine_tune(tiny_llama, tmp_path, seed=3)
    config = json.loads((tuned / "tokenizer_config.json").read_text())
    (tuned / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ messages }}"}))
    result = compile_model(str(tuned), recipe=RECIPE, overrides=[*FAST, "sampling.top_k=7", "name=renamed"],
                           out_root=root)
    # host sampling defaults and a chat template change no graph (the donor: the root's newest of that graph key)
    assert result.graphs_from is not None and result.manifest.graphs["key"] == built.manifest.graphs["key"]
    assert result.manifest.recipe.sampling.top_k == 7


def test_a_donor_altered_on_disk_is_refused_and_the_graphs_compiled(tiny_llama, tmp_path, capsys):
    from neuronpack.progress import NullReporter

    root = tmp_path / "root"
    first = compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=root)
    graphs = first.path / "graphs.pt2"
    data = bytearray(graphs.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only its sha256 tells
    graphs.write_bytes(bytes(data))
    warnings = []

    class Recorder(NullReporter):
        def warn(self, message: str) -> None:
            warnings.append(message)

    second = compile_model(str(_fine_tune(tiny_llama, tmp_path)), recipe=RECIPE, overrides=FAST, out_root=root,
                           reporter=Recorder())
    assert second.graphs_from is None and second.manifest.build["bucket_seconds"]
    assert any("not reusing" in w and "graphs.pt2" in w for w in warnings), warnings
    assert verify_artifact(second.path).key == second.key


def test_an_int8_recipe_reuses_across_requantized_fine_tunes(tiny_llama, tmp_path):
    """Offline quantization runs again on the new weights (new scales, same dtypes and shapes): the graphs carry."""
    root = tmp_path / "root"
    sets = [*FAST, 'quantization.dtype="int8"']
    first = compile_model(str(tiny_llama), recipe=RECIPE, overrides=sets, out_root=root)
    second = compile_model(str(_fine_tune(tiny_llama, tmp_path)), recipe=RECIPE, overrides=sets, out_root=root)
    assert second.graphs_from["key"] == first.key
    scales = [f for f in read_manifest(second.path).files if f.path.endswith(".safetensors")]
    assert scales and {f.sha256 for f in scales}.isdisjoint({f.sha256 for f in read_manifest(first.path).files})


def test_the_cli_reports_the_reuse_and_no_reuse_turns_it_off(donor, tiny_llama, tmp_path):
    import subprocess
    import sys

    built, root = donor
    tuned = _fine_tune(tiny_llama, tmp_path, seed=4)
    args = [sys.executable, "-m", "neuronpack", "compile", str(tuned), "--recipe", str(RECIPE), "--set",
            "compiler=export", "--out-root", str(root), "--progress", "plain"]
    out = subprocess.run([*args, "--format", "json"], capture_output=True, text=True, check=True)
    summary = json.loads(out.stdout)
    donor_key = summary["graphs_from"]["key"]  # the root's newest artifact of this graph key
    graphs = json.loads((root / "neuron-compiled-artifacts" / donor_key / "neuronpack.json").read_text())["graphs"]
    assert graphs["key"] == built.manifest.graphs["key"]
    assert summary["graphs_from"]["compile_seconds_saved"] == graphs["seconds"]
    assert f"reusing the compiled graphs of {donor_key[:16]}" in out.stderr
    shown = subprocess.run([sys.executable, "-m", "neuronpack", "inspect", summary["path"]], capture_output=True,
                           text=True, check=True, env={**os.environ, "COLUMNS": "200"}).stdout
    assert f"graph key {graphs['key'][:16]}, from {donor_key[:16]} (local store;" in shown
    shutil.rmtree(summary["path"])
    again = subprocess.run([*args, "--no-reuse"], capture_output=True, text=True, check=True)
    assert "reusing" not in again.stderr and again.stdout.strip().splitlines()[-1] == summary["path"]


def test_a_new_eagle_draft_of_the_same_shape_reuses_the_draft_graphs(tiny_llama, tmp_path):
    from tests.convert.eagle_fixtures import make_eagle1_draft

    vocab = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    root = tmp_path / "root"

    def build(model: Path, seed: int):
        draft = make_eagle1_draft(tmp_path / f"draft-{seed}", vocab=vocab, layout="safetensors", dtype="float32",
                                  seed=seed)
        sets = [*FAST, 'speculation.kind="eagle"', f'speculation.draft="{draft}"', "speculation.length=3"]
        return compile_model(str(model), recipe=RECIPE, overrides=sets, out_root=root)

    first = build(tiny_llama, seed=1)
    second = build(_fine_tune(tiny_llama, tmp_path), seed=2)  # a retrained draft for a retrained target
    assert second.graphs_from["key"] == first.key
    assert set(json.loads((second.path / "neuron_config.json").read_text())["graphs"]) >= {"draft_step", "draft_head"}
    mine, theirs = ({f.path: f.sha256 for f in r.manifest.files} for r in (second, first))
    drafts = [p for p in mine if p.startswith("draft/") and p.endswith(".safetensors")]
    assert drafts and all(mine[p] != theirs[p] for p in drafts)  # the new draft's weights, converted again


def test_new_lora_adapters_of_the_same_shape_reuse_the_graphs(tiny_llama, tmp_path):
    from tests.helpers.lora_adapters import make_peft_adapter

    root = tmp_path / "root"

    def build(model: Path, seed: int):
        adapter = make_peft_adapter(tiny_llama, tmp_path / f"adapter-{seed}", rank=4, seed=seed)
        sets = [*FAST, f'lora.adapters=[{{name="a{seed}", path="{adapter}"}}]', "lora.max_rank=8"]
        return compile_model(str(model), recipe=RECIPE, overrides=sets, out_root=root)

    first = build(tiny_llama, seed=1)
    second = build(_fine_tune(tiny_llama, tmp_path), seed=2)  # another adapter (and name) of the same rank
    assert second.graphs_from["key"] == first.key
    assert [p.name for p in (second.path / "lora").iterdir()] == ["a2"]
    third = compile_model(str(tiny_llama), recipe=RECIPE, out_root=root, overrides=[
        *FAST, f'lora.adapters=[{{name="r8", path="{make_peft_adapter(tiny_llama, tmp_path / "r8", rank=8)}"}}]',
        "lora.max_rank=8"])
    assert third.graphs_from is None  # another rank: other tensor shapes, another graph key
