"""compile_model end to end: real builds through the torch backend, cache hits, concurrency, kills, failures."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuronpack.artifacts.manifest import read_manifest
from neuronpack.artifacts.store import artifacts_root
from neuronpack.artifacts.verify import quick_check
from neuronpack.errors import BuildError, NeuronpackError, RecipeError
from neuronpack.pipeline import compile_model, verify_artifact
from tests.helpers.fresh_interpreter import run_fresh
from tests.pipeline.builds import FAST, RECIPE

# What a cache hit must not import: torch, transformers, numpy, pydantic (the recipe comes from recipe_memo once it
# was validated, the manifest is checked as JSON) and the code only a build, a conversion, a remote store or a server
# runs (a hit costs little more than `neuronpack --version`; bench/cache_hit.py).
BUILD_ONLY_MODULES = (
    "torch", "transformers", "safetensors", "numpy", "pydantic",
    "neuronpack.models", "neuronpack.convert.eagle", "neuronpack.convert.quantize", "neuronpack.accuracy",
    "neuronpack.backends.torch_aot.build", "neuronpack.backends.torch_aot.load",
    "neuronpack.backends.torch_aot.compile",
    "neuronpack.checkpoint.writer", "neuronpack.checkpoint.gguf_import",
    "neuronpack.artifacts.remote", "neuronpack.pipeline.prepare", "neuronpack.pipeline.serving",
    "neuronpack.runtime.engine", "neuronpack.runtime.openai.server",
)


def cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "neuronpack", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def test_build_publishes_a_verified_artifact(built_artifact, tiny_llama):
    path = built_artifact.path
    assert not built_artifact.cache_hit
    assert path.parent.name == "neuron-compiled-artifacts" and path.name == built_artifact.key
    manifest = verify_artifact(path)
    assert manifest.framework == "torch"
    assert manifest.buckets.to_dict() == {"context": [16, 64], "token_generation": [64, 128],
                                          "max_context_length": 64, "seq_len": 128}
    assert manifest.serve.max_num_seqs == 2 and manifest.serve.max_model_len == 128
    assert manifest.model.source == str(tiny_llama)
    names = {f.path for f in manifest.files}
    assert {"neuron_config.json", "config.json", "tokenizer.json"} <= names
    assert any(n.startswith("weights/") for n in names)
    assert set(manifest.timings) >= {"resolve", "key", "build"}
    assert "torch" in manifest.versions and "neuronpack" in manifest.versions
    # the typed manifest reads and re-dumps the file exactly (nothing dropped, no key renamed)
    assert manifest.to_json() == json.loads((path / "neuronpack.json").read_text())


def test_second_compile_is_a_cache_hit(built_artifact, tiny_llama):
    again = compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=built_artifact.path.parents[1])
    assert again.cache_hit and again.path == built_artifact.path and again.key == built_artifact.key


def _cli_hit(built_artifact, tiny_llama, probe: str) -> tuple[str, str, bool]:
    """`neuronpack compile` of the built artifact's inputs in a fresh interpreter: (its JSON line, what the Python
    expression ``probe`` printed afterwards, whether torch was imported)."""
    argv = ["neuronpack", "compile", str(tiny_llama), "--recipe", str(RECIPE), *[a for o in FAST for a in ("--set", o)],
            "--out-root", str(built_artifact.path.parents[1]), "--format", "json", "--quiet"]
    code = (
        "import sys\n"
        "from neuronpack.cli.app import app\n"
        f"sys.argv = {argv!r}\n"
        "try:\n    app()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        f"print({probe})\n"
    )
    out, torch_imported = run_fresh(code)
    result, _, probed = out.rpartition("\n")
    return result, probed, torch_imported


def test_cache_hit_from_the_cli_imports_no_build_code(built_artifact, tiny_llama):
    # validated once here (in this test's cache directory): the CLI hit reads the recipe from the memo
    compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=built_artifact.path.parents[1])
    result, loaded, torch_imported = _cli_hit(built_artifact, tiny_llama,
                                              f"sorted(m for m in sys.modules if m.startswith({BUILD_ONLY_MODULES!r}))")
    assert json.loads(result)["cache_hit"] is True
    assert loaded == "[]" and not torch_imported


def test_a_cli_hit_validates_a_recipe_it_has_not_seen_then_remembers_it(built_artifact, tiny_llama, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("NEURONPACK_CACHE_DIR", str(tmp_path / "empty-cache"))  # no memo, no digests
    for validated in ("True", "False"):  # validated (pydantic) the first time, from the memo the second
        result, pydantic_imported, _ = _cli_hit(built_artifact, tiny_llama, "'pydantic' in sys.modules")
        assert json.loads(result)["key"] == built_artifact.key and json.loads(result)["cache_hit"] is True
        assert pydantic_imported == validated
    bad = tmp_path / "bad.toml"  # a bad recipe is refused as ever, with the memo filled
    bad.write_text(RECIPE.read_text() + "\n[sampling]\ntop_p = 2.0\n")
    proc = subprocess.run([sys.executable, "-m", "neuronpack", "compile", str(tiny_llama), "--recipe", str(bad),
                           "--out-root", str(built_artifact.path.parents[1])], capture_output=True, text=True)
    assert proc.returncode == 1 and "sampling.top_p" in proc.stderr and str(bad) in proc.stderr


def test_changed_recipe_builds_a_new_key(built_artifact, tiny_llama, tmp_path):
    other = compile_model(str(tiny_llama), recipe=RECIPE, overrides=[*FAST, "buckets.context=[64]"],
                          out_root=tmp_path, dry_run=True)
    assert other.key != built_artifact.key and other.dry_run


def test_dry_run_builds_nothing(tiny_llama, tmp_path):
    result = compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=tmp_path, dry_run=True)
    assert result.dry_run and not result.path.exists() and result.compile_config


def test_no_model_is_a_recipe_error(tmp_path):
    with pytest.raises(RecipeError, match="no model to compile"):
        compile_model(None, recipe=RECIPE, out_root=tmp_path)


def test_concurrent_compiles_build_once(tiny_llama, tmp_path):
    args = ["compile", str(tiny_llama), "--recipe", str(RECIPE), "--set", "compiler=export",
            "--out-root", str(tmp_path), "--format", "json", "--quiet"]
    procs = [cli(*args) for _ in range(3)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({r["path"] for r in results}) == 1
    assert sorted(r["cache_hit"] for r in results) == [False, True, True]
    assert quick_check(Path(results[0]["path"])) is not None


def test_sigkill_during_build_leaves_nothing_valid_and_rebuild_works(tiny_llama, tmp_path):
    store = artifacts_root(tmp_path)
    args = ["compile", str(tiny_llama), "--recipe", str(RECIPE), "--set", "compiler=export",
            "--out-root", str(tmp_path), "--quiet"]
    proc = cli(*args)
    # The marker: the model's config.json is copied into the staging directory after the weights and right before
    # the graphs are exported, so the build is mid-way (and has seconds of graph export left) when we kill it.
    def reached_graph_export() -> bool:  # staging directories are hidden (.neuronpack-staging-*): pathlib sees them
        return any((store / ".staging").glob("*/config.json"))

    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not reached_graph_export():
        time.sleep(0.01)
    assert reached_graph_export(), "the build never reached graph export"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL  # killed mid-build, not finished before the signal
    published = [p for p in store.iterdir() if not p.name.startswith(".")]
    assert all(quick_check(p) is None for p in published)
    result = compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=tmp_path)
    assert not result.cache_hit
    verify_artifact(result.path)


def test_failed_build_keeps_a_log_and_never_blocks_a_retry(make_checkpoint, tmp_path):
    model = make_checkpoint("llama")
    config = json.loads((model / "config.json").read_text())
    good = dict(config)
    config["model_type"] = "gpt_bigcode"  # not a Llama-family model: the torch backend refuses it
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(NeuronpackError):
        compile_model(str(model), recipe=RECIPE, overrides=FAST, out_root=tmp_path)
    store = artifacts_root(tmp_path)
    logs = list((store / ".failed").iterdir())
    assert len(logs) == 1 and "key:" in logs[0].read_text()
    assert not [p for p in (store / ".staging").iterdir()]
    (model / "config.json").write_text(json.dumps(good))
    result = compile_model(str(model), recipe=RECIPE, overrides=FAST, out_root=tmp_path)
    verify_artifact(result.path)


def test_force_rebuilds_in_place(built_artifact, tiny_llama, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(built_artifact.path.parents[1], root, ignore=shutil.ignore_patterns(".*"))
    first = read_manifest(root / "neuron-compiled-artifacts" / built_artifact.key)
    result = compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=root, force=True)
    assert not result.cache_hit and result.key == built_artifact.key
    assert read_manifest(result.path).created_by["pid"] == os.getpid()
    assert first.key == result.key


def test_internal_build_failure_is_wrapped_with_log(tiny_llama, tmp_path, monkeypatch):
    from neuronpack.backends.select import get_backend

    backend_cls = type(get_backend("torch"))

    def explode(self, request):
        (request.staging / "partial.bin").write_bytes(b"x")
        raise RuntimeError("compiler crashed")

    monkeypatch.setattr(backend_cls, "build", explode)
    with pytest.raises(BuildError, match="compiler crashed") as info:
        compile_model(str(tiny_llama), recipe=RECIPE, overrides=FAST, out_root=tmp_path)
    assert Path(info.value.where).is_file()
    store = artifacts_root(tmp_path)
    assert [p.name for p in store.iterdir() if not p.name.startswith(".")] == []


def test_neuron_frameworks_key_a_remembered_recipe_without_pydantic(tiny_llama, tmp_path):
    """A cache hit on a Neuron machine keys the inputs with the nxd / tnx backend (versions and target): from the
    recipe memo that takes no pydantic either, and gives the key --dry-run gives."""
    recipe = Path(__file__).parents[2] / "recipes" / "llama-3.1-8b-instruct-trn1.toml"
    keys = [compile_model(str(tiny_llama), recipe=recipe, framework=fw, out_root=tmp_path, dry_run=True).key
            for fw in ("nxd", "tnx")]  # validated here: the memo knows the recipe now
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from neuronpack.pipeline.inputs import resolve_inputs\n"
        "from neuronpack.pipeline.plan import plan_build\n"
        "from neuronpack.progress import NullReporter\n"
        "for fw in ('nxd', 'tnx'):\n"
        f"    inputs = resolve_inputs({str(tiny_llama)!r}, recipe_path=Path({str(recipe)!r}), overrides=[],\n"
        "                            framework=fw, reporter=NullReporter())\n"
        f"    print(plan_build(inputs, out_root=Path({str(tmp_path)!r}), dest=None).key)\n"
        "print('pydantic' in sys.modules)\n"
    )
    out, torch_imported = run_fresh(code)
    *fresh_keys, pydantic_imported = out.splitlines()
    assert fresh_keys == keys and pydantic_imported == "False" and not torch_imported
