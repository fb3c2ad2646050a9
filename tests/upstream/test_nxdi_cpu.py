"""Upstream NxD Inference's own Llama, on this CPU, as the judge of what neuronpack writes for nxd artifacts.

For every nxd recipe (the recipe's NeuronConfig kwargs as ``neuronpack compile --dry-run`` records them, on a tiny
random Llama) and for checkpoints made by ``neuronpack quantize``, upstream NxDI 0.9.0 (``../shared/upstream`` or
``UPSTREAM_SRC``) loads the checkpoint through its own loader and quantization and runs it teacher-forced
(tests/upstream/nxdi_cpu.py, one worker process in ``.venv-nxdi``: NxDI's transformers 4.57 beside this project's
packages). The closed Neuron packages are a strict shim (tests/upstream/closed_shim.py): any call into them while
loading or running fails the test. Compared with transformers: float32 within 1e-4, bf16 greedy equal, int8 / fp8
against transformers on the dequantized weights within 1e-4. Negative cases prove the judge can fail: NxDI refuses a
scale of the wrong shape and a float lm_head not listed in modules_to_not_convert.

EAGLE-1 and EAGLE-3 drafts from ``neuronpack convert-eagle`` are loaded, with the target, into NxDI's
``NeuronFusedSpecModel`` (every ``draft_model.*`` / ``target_model.*`` weight given, with its shape); a draft without
lm_head is refused.

Not run here, because upstream has no CPU path for them: tp > 1, the fused speculation (EAGLE) forward, Mllama, LoRA
serving; the bucketed token-generation graph (the check runs context encoding once per prefix).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("nxdi_cpu.py")
NP = [sys.executable, "-m", "neuronpack"]
TOKENS = [1, 5, 7, 9, 11, 13, 2, 3, 40, 51, 17, 90]
PROMPT_LEN = 6


def upstream_sources() -> list[Path] | None:
    """NxDI and NxD src directories: UPSTREAM_SRC's, else ../shared/upstream beside the clone; None when neither."""
    for base in (os.environ.get("UPSTREAM_SRC"), ROOT.parent / "shared" / "upstream"):
        if base:
            dirs = [Path(base) / "neuronx-distributed-inference" / "src", Path(base) / "neuronx-distributed" / "src"]
            if all(d.is_dir() for d in dirs):
                return dirs
    return None


def nxdi_recipes(*, llama_only: bool = False) -> list[Path]:
    """Every shipped recipe for the nxd framework on a text model (Mllama has no CPU path upstream); ``llama_only``:
    those for a Llama-family checkpoint (the 2026 families' recipes run on their own: test_nxdi_families.py)."""
    from tests.upstream.family_checkpoints import recipe_family

    return [p for p in sorted((ROOT / "recipes").glob("*.toml"))
            if 'framework = "nxd"' in p.read_text() and "vision" not in p.stem
            and not (llama_only and recipe_family(p))]


def _np(*args: str) -> str:
    return subprocess.run([*NP, *args], capture_output=True, text=True, check=True).stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recorded_neuron_config(model: Path, recipe: Path, root: Path, *sets: str) -> dict:
    dry = json.loads(_np("compile", str(model), "--recipe", str(recipe), "--dry-run", "--format", "json",
                         "--out-root", str(root), *sets))
    return dry["neuron_config"]


def _quantize(model: Path, out: Path, *args: str) -> Path:
    _np("quantize", str(model), "--out", str(out), "--progress", "none", *args)
    return out


def _edited_copy(checkpoint: Path, out: Path, edit) -> Path:
    """A copy of ``checkpoint`` whose tensors went through ``edit(tensors)`` (a dict, changed in place)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(checkpoint, out)
    tensors = load_file(checkpoint / "model.safetensors")
    edit(tensors)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _plant_bad_scale(quantized: Path, out: Path) -> Path:
    """A copy of ``quantized`` with one per-channel scale stored as [out] instead of [out, 1]."""
    name = "model.layers.0.mlp.down_proj.scale"
    return _edited_copy(quantized, out, lambda t: t.update({name: t[name].reshape(-1)}))


def _drop_weight(model: Path, out: Path, name: str) -> Path:
    """A copy of ``model`` without the tensor ``name`` (upstream loads with strict=False: only our check sees it)."""
    return _edited_copy(model, out, lambda t: t.pop(name))


def _reference_logits(model_dir: Path, dtype: str = "float32", quantized: Path | None = None):
    """transformers' teacher-forced logits (rows: after the prompt, then after each further token); with
    ``quantized`` the model runs on that checkpoint's weights dequantized (int8 / fp8 values x scale)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    if quantized is not None:
        from neuronpack.accuracy.nxdi_cpu import dequantized_reference

        model = dequantized_reference(model, str(quantized))
    with torch.no_grad():
        return model(torch.tensor([TOKENS])).logits[0, PROMPT_LEN - 1:].float()


def nxdi_setup(tmp_path_factory, name: str):
    """(upstream source dirs, .venv-nxdi's python, a work dir, a tiny Llama in it): skips where no upstream sources
    are present (a user's fresh clone), fails where they are but ``make install`` did not make .venv-nxdi."""
    sources = upstream_sources()
    if sources is None:
        pytest.skip("no upstream NxD Inference sources: neither UPSTREAM_SRC nor ../shared/upstream is present")
    python = Path(os.environ.get("NEURONPACK_NXDI_PYTHON", ROOT / ".venv-nxdi" / "bin" / "python"))
    if not python.is_file():
        pytest.fail(f"{python} is missing: run `make install` (it makes .venv-nxdi, NxDI's transformers 4.57)")
    from tests.helpers.tiny_models import make_tiny_checkpoint

    work = tmp_path_factory.mktemp(name)
    return sources, python, work, make_tiny_checkpoint(work / "llama")


@pytest.fixture(scope="module")
def nxdi(tmp_path_factory):
    """Every run below through one upstream worker: {name: (result, reference logits or None)}."""
    sources, python, work, llama = nxdi_setup(tmp_path_factory, "nxdi")
    runs, references = {}, {}

    def add(name, neuron_config, dtype, model=llama, reference=None, draft=None, **extra):
        runs[name] = {"model_dir": str(model), "neuron_config": neuron_config, "dtype": dtype, "tokens": TOKENS,
                      "prompt_len": PROMPT_LEN, "draft_dir": str(draft) if draft else None, **extra}
        references[name] = reference

    fp32 = _reference_logits(llama)
    int8_recipe = None
    for recipe in nxdi_recipes(llama_only=True):
        recorded = _recorded_neuron_config(llama, recipe, work / "root", *_recipe_sets(recipe, work, llama))
        config = recorded  # speculation keys are dropped by nxdi_cpu.cpu_neuron_config (no CPU speculation)
        if config.get("quantized"):
            int8_recipe = config
            continue
        add(f"{recipe.stem} float32", config, "float32", reference=fp32)
        if recorded.get("torch_dtype") == "bfloat16" and recipe.stem == "llama-3.2-1b-inf2":
            add(f"{recipe.stem} bfloat16", config, "bfloat16", reference=_reference_logits(llama, "bfloat16"))
    assert int8_recipe is not None, "no quantized nxd recipe in recipes/"
    cases = {"int8 per-channel": ("int8", "per-channel", "per_channel_symmetric", "int8"),
             "int8 per-tensor": ("int8", "per-tensor", "per_tensor_symmetric", "int8"),
             "fp8 per-channel": ("fp8", "per-channel", "per_channel_symmetric", "f8e4m3")}
    made = {}
    for name, (dtype, granularity, qtype, qdtype) in cases.items():
        out = made[name] = _quantize(llama, work / name.replace(" ", "-"), "--dtype", dtype, "--granularity",
                                     granularity)
        add(name, {**int8_recipe, "quantized_checkpoints_path": str(out), "quantization_type": qtype,
                   "quantization_dtype": qdtype}, "float32", reference=_reference_logits(llama, quantized=out))
    from tests.helpers.tiny_models import make_tiny_checkpoint

    tied = make_tiny_checkpoint(work / "tied", tie=True)  # SmolLM2's layout: --include-lm-head unties the head
    head = _quantize(tied, work / "int8-tied-head", "--dtype", "int8", "--include-lm-head")
    add("int8 tied head untied", {**int8_recipe, "quantized_checkpoints_path": str(head), "modules_to_not_convert": []},
        "float32", model=head, reference=_reference_logits(tied, quantized=head))
    bad = _plant_bad_scale(made["int8 per-channel"], work / "bad-scale")
    add("negative: scale [out]", {**int8_recipe, "quantized_checkpoints_path": str(bad)}, "float32")
    add("negative: float lm_head not skipped", {**int8_recipe, "modules_to_not_convert": [],
                                                "quantized_checkpoints_path": str(made["int8 per-channel"])},
        "float32")
    add("negative: a weight missing", runs["llama-3.2-1b-inf2 float32"]["neuron_config"], "float32",
        model=_drop_weight(llama, work / "missing-weight", "model.layers.1.mlp.up_proj.weight"))
    _add_eagle_runs(add, work, llama)
    _add_lora_run(add, work, llama)
    # after the fused loads, in the same process: NxDI's fused loader leaves a class attribute set (see nxdi_cpu.py)
    add("target after fused loads", runs["llama-3.2-1b-inf2 float32"]["neuron_config"], "float32", reference=fp32)
    results = run_worker(python, sources, work, runs)
    if os.environ.get("NEURONPACK_NXDI_REPORT"):  # the figures, for docs and notes: {name: max |dlogit|, greedy}
        figures = _figures(results, references, runs)
        Path(os.environ["NEURONPACK_NXDI_REPORT"]).write_text(json.dumps(figures, indent=1))
    return {name: (results[name], references[name]) for name in runs}


def run_worker(python: Path, sources, work: Path, runs: dict) -> dict:
    """Every run through one upstream worker process (nxdi_cpu.py in .venv-nxdi); {run name: result}."""
    import torch

    spec = work / "spec.json"
    spec.write_text(json.dumps({"sys_path": [str(s) for s in sources], "port": _free_port(), "runs": runs}))
    out = work / "results.pt"
    done = subprocess.run([str(python), str(WORKER), str(spec), str(out)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out)


def _figures(results: dict, references: dict, runs: dict) -> dict:
    """{run: NxDI's figures}, with `neuronpack quantize`'s own report (SNR, relative error) beside quantized runs."""
    figures = {}
    for name, result in results.items():
        reference = references[name]
        quantized = Path(runs[name]["neuron_config"].get("quantized_checkpoints_path") or "/nonexistent")
        if (quantized / "quantization_report.json").is_file() and "error" not in result:
            model = json.loads((quantized / "quantization_report.json").read_text())["model"]
            figures[name] = {"quantize_report": {"snr_db": model["snr_db"],
                                                 "relative_error": model["relative_error"]}}
        if "loaded" in result or "lora_weights" in result:
            figures[name] = {"loaded": result.get("loaded") or len(result["lora_weights"])}
            continue
        if "error" in result or reference is None:
            figures[name] = {**figures.get(name, {}), "refused": result.get("error", "")[:160]}
            continue
        figures[name] = {**figures.get(name, {}),
                         "max_abs_dlogit": (result["logits"] - reference).abs().max().item(),
                         "greedy_equal": result["logits"].argmax(-1).tolist() == reference.argmax(-1).tolist()}
    return figures


def _recipe_sets(recipe: Path, work: Path, llama: Path) -> list[str]:
    if "[speculation]" not in recipe.read_text():
        return []
    from tests.convert.eagle_fixtures import make_eagle1_draft

    vocab = json.loads((llama / "config.json").read_text())["vocab_size"]
    draft = work / "eagle"
    if not draft.exists():
        make_eagle1_draft(draft, hidden=64, vocab=vocab, layout="safetensors")
    return ["--set", f"speculation.draft={draft}"]


def _add_eagle_runs(add, work: Path, llama: Path) -> None:
    """EAGLE-1 (on the 2-layer Llama) and EAGLE-3 (on a 4-layer one: its draft reads target layers 2, L // 2 and
    L - 3) drafts converted by ``neuronpack convert-eagle``, each with the NeuronConfig the EAGLE recipe records for
    it; and the raw EAGLE-1 draft (no lm_head) as the negative case."""
    from tests.convert.eagle_fixtures import make_eagle1_draft, make_eagle3_draft
    from tests.helpers.tiny_models import make_tiny_checkpoint

    recipe = ROOT / "recipes" / "llama-3-8b-eagle-trn1.toml"
    vocab = json.loads((llama / "config.json").read_text())["vocab_size"]
    deep = make_tiny_checkpoint(work / "llama-4-layers", layers=4)
    for kind, target, make in (("eagle1", llama, make_eagle1_draft), ("eagle3", deep, make_eagle3_draft)):
        raw = make(work / f"{kind}-raw", hidden=64, vocab=vocab, layout="safetensors")
        converted = work / f"{kind}-converted"
        _np("convert-eagle", "--draft", str(raw), "--target", str(target), "--out", str(converted),
            "--progress", "none")
        recorded = _recorded_neuron_config(target, recipe, work / f"root-{kind}", "--set",
                                           f"speculation.draft={converted}")
        add(f"{kind} fused", recorded, "float32", model=target, draft=converted)
        if kind == "eagle1":
            add("negative: draft without lm_head", recorded, "float32", model=target, draft=raw)


def _add_lora_run(add, work: Path, llama: Path) -> None:
    """The 8B recipe's LoRA variant (a [lora] section, one PEFT adapter on q/k/v/o) with its adapter where the
    artifact carries it (lora/<name>, which lora_ckpt_paths names relative to the artifact): load only."""
    from tests.helpers.lora_adapters import make_peft_adapter

    artifact = work / "lora-artifact"
    adapter = make_peft_adapter(llama, artifact / "lora" / "sql", rank=8)
    recipe = work / "lora-recipe.toml"
    recipe.write_text((ROOT / "recipes" / "llama-3.1-8b-instruct-trn1.toml").read_text()
                      + f'\n[lora]\nmax_rank = 8\nmax_loras = 1\nadapters = [{{name = "sql", path = "{adapter}"}}]\n')
    recorded = _recorded_neuron_config(llama, recipe, work / "root-lora")
    add("lora load", recorded, "float32", load_only=True, cwd=str(artifact))


def _ran(nxdi, name):
    result, reference = nxdi[name]
    assert "error" not in result, f"NxDI refused {name}: {result['error']}"
    assert result["closed_calls"] == [], f"closed Neuron code ran on the CPU path: {result['closed_calls']}"
    return result, reference


@pytest.mark.parametrize("recipe", [*(p.stem for p in nxdi_recipes(llama_only=True) if "int8" not in p.stem),
                                    "target after fused loads"])
def test_recipe_float32_equals_transformers(nxdi, recipe):
    result, reference = _ran(nxdi, recipe if recipe.startswith("target") else f"{recipe} float32")
    diff = (result["logits"] - reference).abs().max().item()
    assert diff < 1e-4, f"{recipe}: NxDI vs transformers max |dlogit| {diff:.3g}"


def test_bfloat16_greedy_equals_transformers(nxdi):
    result, reference = _ran(nxdi, "llama-3.2-1b-inf2 bfloat16")
    assert result["logits"].argmax(-1).tolist() == reference.argmax(-1).tolist()


@pytest.mark.parametrize("case", ["int8 per-channel", "int8 per-tensor", "fp8 per-channel", "int8 tied head untied"])
def test_quantized_checkpoint_equals_dequantized_transformers(nxdi, case):
    result, reference = _ran(nxdi, case)
    # NxD's quantization convert() ran: quantized layers, not float ones loading int values as floats
    assert any(name.startswith("Quantized") for name in result["modules"]), result["modules"]
    diff = (result["logits"] - reference).abs().max().item()
    assert diff < 1e-4, f"{case}: NxDI vs dequantized transformers max |dlogit| {diff:.3g}"


@pytest.mark.parametrize(("case", "reason"), [("negative: scale [out]", "shape"),
                                              ("negative: float lm_head not skipped", "lm_head.scale"),
                                              ("negative: a weight missing", "layers.1.mlp.up_proj.weight")])
def test_malformed_checkpoints_are_refused(nxdi, case, reason):
    result, _ = nxdi[case]
    assert "error" in result, f"NxDI accepted {case}: the judge cannot fail"
    assert reason in result["error"], result["error"]


@pytest.mark.parametrize("case", ["eagle1 fused", "eagle3 fused"])
def test_converted_eagle_drafts_load_into_nxdis_fused_speculation_model(nxdi, case):
    """Every draft_model.* and target_model.* weight NeuronFusedSpecModel has is given, with its shape (a shape
    mismatch raises in load_state_dict; a missing weight in neuronpack's check). Nothing runs: upstream has no
    fused-speculation forward on the CPU."""
    result = nxdi[case][0]
    assert "error" not in result, f"NxDI refused {case}: {result['error']}"
    assert result["closed_calls"] == [], result["closed_calls"]
    assert result["loaded"]["draft_model"] > 0 and result["loaded"]["target_model"] > 0, result["loaded"]


def test_a_draft_without_lm_head_is_refused(nxdi):
    """The raw EAGLE-1 draft (what convert-eagle adds the head to): upstream alone would load it silently."""
    result, _ = nxdi["negative: draft without lm_head"]
    assert "error" in result and "draft_model.lm_head.weight" in result["error"], result.get("error")


def test_the_lora_variant_loads_its_adapter_into_nxdis_multi_lora_layers(nxdi):
    """The LoRA recipe's NeuronConfig builds NxDI's MultiLora layers and loads the base checkpoint and the adapter
    (every LoRA A / B weight non-zero: PEFT's random adapter). Its CPU forward is upstream's to fix: NxDI 0.9.0's
    ``_copy_past_key_values`` raises "IndexError: index 4 is out of range" on it (docs/neuron.md)."""
    result = nxdi["lora load"][0]
    assert "error" not in result, f"NxDI refused the LoRA variant: {result['error']}"
    assert result["closed_calls"] == [], result["closed_calls"]
    assert any(name.startswith("MultiLora") for name in result["modules"]), result["modules"]
    # 2 layers x q, k, v, o x (A, B)
    assert len(result["lora_weights"]) == 16 and all(v > 0 for v in result["lora_weights"].values())
