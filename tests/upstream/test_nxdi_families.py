"""Upstream NxD Inference 0.9.0's own classes of the 2026 families (Qwen3 tied and untied, Qwen3-MoE, gpt-oss,
Llama 4's text decoder) judge what neuronpack makes of them, on this CPU, against transformers.

Each family's tiny random checkpoint in its released layout (tests/upstream/family_checkpoints.py: gpt-oss in the
MXFP4 layout, Llama 4 in Meta's multimodal one) gets the NeuronConfig its shipped recipe records (``compile
--dry-run``) and NxDI's class compile named; NxDI loads it through its own converter and scores 24 tokens teacher-
forced (18 rows): top-1 must agree everywhere and the logits within 1e-4 of transformers' float32 ones. Checkpoints
from ``compile`` with a ``[quantization]`` (the stand-in SDK builds: neuronx-cc is not here) are loaded through NxDI's
quantized layers and compared with transformers on their dequantized weights. One worker process runs them all
(tests/upstream/nxdi_cpu.py, .venv-nxdi, the strict closed-package shim).

The harness's one substitution, the layer-boundary markers Qwen3-MoE wraps each layer in (XLA custom calls), is the
identity here; without it neuronpack's check reports Qwen3-MoE as not scorable, naming the markers (an upstream
limit, docs/neuron.md). The user's paths (``neuronpack eval``, ``compile --check-accuracy``) are in
test_nxdi_family_eval.py. Set NEURONPACK_NXDI_REPORT=FILE to write the figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuronpack.pipeline import compile_model
from tests.upstream.family_checkpoints import write_family_checkpoint
from tests.upstream.test_nxdi_cpu import ROOT, nxdi_setup, run_worker

TOKENS = [1, 5, 7, 9, 11, 13, 2, 3, 40, 51, 17, 90, 100, 120, 33, 60, 70, 80, 99, 101, 150, 200, 250, 300]
PROMPT_LEN = 7
RECIPES = {"qwen3": "qwen3-8b-trn1", "qwen3_tied": "qwen3-8b-inf2", "qwen3_moe": "qwen3-30b-a3b-trn2",
           "gpt_oss": "gpt-oss-20b-trn2", "llama4": "llama-4-scout-trn2"}
# quantized cases: family -> recipe [quantization] as --set lines (gpt-oss: its attention projections have biases,
# which NxD's quantized layers cannot take, so they are skipped and the head quantized: see quant_plan.py)
QUANTIZED = {"qwen3 int8": ("qwen3", ["quantization.dtype=int8"]),
             "qwen3_moe fp8": ("qwen3_moe", ["quantization.dtype=fp8"]),
             "gpt_oss int8 head": ("gpt_oss", ["quantization.dtype=int8", "quantization.include_lm_head=true",
                                               'quantization.skip=["*.self_attn"]']),
             "llama4 int8": ("llama4", ["quantization.dtype=int8"])}
STANDIN = ROOT / "tests" / "backends" / "neuron_standin"
pytestmark = pytest.mark.slow  # one worker run of 14 NxDI loads: ~40 s alone, more under load


def reference_logits(model_dir: Path, quantized: Path | None = None):
    """transformers' float32 teacher-forced logits from the last prompt position on (on the dequantized weights of
    ``quantized``, when given)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).float().eval()
    if quantized is not None:
        from neuronpack.accuracy.nxdi_cpu import dequantized_reference

        model = dequantized_reference(model, str(quantized))
    with torch.no_grad():
        return model(torch.tensor([TOKENS])).logits[0, PROMPT_LEN - 1:].float()


def standin_builds(builds: dict[str, tuple[Path, Path, list[str]]], root: Path) -> dict[str, dict]:
    """``neuronpack compile`` (pipeline.compile_model) of each (checkpoint, recipe, --set lines) with the stand-in SDK
    (neuronx-cc is not here), all in one process: {name: the manifest's compile_config} (a quantized recipe's
    quantized_checkpoints_path: the checkpoint the pipeline quantized). The artifact is ``compile_config["path"]``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STANDIN / "nxd"), str(STANDIN / "compiler"), str(ROOT)])}
    script = ("import json, sys; from pathlib import Path; from neuronpack.pipeline import compile_model\n"
              "out = {}\n"
              "for name, (model, recipe, sets) in json.loads(sys.argv[1]).items():\n"
              "    r = compile_model(model, recipe=Path(recipe), overrides=sets, out_root=Path(sys.argv[2]))\n"
              "    out[name] = {**r.manifest_json['compile_config'], 'path': str(r.path)}\n"
              "print(json.dumps(out))")
    spec = {name: [str(model), str(recipe), list(sets)] for name, (model, recipe, sets) in builds.items()}
    done = subprocess.run([sys.executable, "-c", script, json.dumps(spec), str(root)], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """{run name: (result, reference logits or None)} of one worker run over every family case."""
    sources, python, work, _ = nxdi_setup(tmp_path_factory, "families")
    checkpoints = {name: write_family_checkpoint(work / name, name) for name in RECIPES}
    runs, references = {}, {}
    for name, recipe in RECIPES.items():  # what `compile --dry-run` records (pipeline.compile_model, in process)
        dry = compile_model(str(checkpoints[name]), recipe=ROOT / "recipes" / f"{recipe}.toml", dry_run=True,
                            out_root=work / "root").compile_config
        runs[name] = {"model_dir": str(checkpoints[name]), "neuron_config": dry["neuron_config"],
                      "model_class": dry["model_class"], "dtype": "float32", "tokens": TOKENS,
                      "prompt_len": PROMPT_LEN}
        references[name] = reference_logits(checkpoints[name])
    built = standin_builds({name: (checkpoints[family], ROOT / "recipes" / f"{RECIPES[family]}.toml", sets)
                            for name, (family, sets) in QUANTIZED.items()}, work / "q")
    for name, (family, _) in QUANTIZED.items():
        config = built[name]
        runs[name] = {**runs[family], "neuron_config": config["neuron_config"]}
        references[name] = reference_logits(checkpoints[family],
                                            Path(config["neuron_config"]["quantized_checkpoints_path"]))
    runs["qwen3_moe limits"] = {**runs["qwen3_moe"], "limits": True}
    references["qwen3_moe limits"] = None
    runs["gemma3 judge"] = {**runs["qwen3"], "judge": str(work / "gemma3-verdict.json"), "arch": "Gemma3ForCausalLM"}
    references["gemma3 judge"] = None
    # config.json as transformers 5 writes it (rope_theta 1e6 inside rope_parameters): NxDI's transformers 4.57 would
    # take 1e4 without neuronpack's renamed keys (families.transformers4_overrides)
    renamed = write_family_checkpoint(work / "qwen3-t5-config", "qwen3", released=False)
    assert "rope_parameters" in json.loads((renamed / "config.json").read_text())
    runs["qwen3 transformers-5 config"] = {**runs["qwen3"], "model_dir": str(renamed)}
    references["qwen3 transformers-5 config"] = reference_logits(renamed)
    results = run_worker(python, sources, work, runs)
    if os.environ.get("NEURONPACK_NXDI_REPORT"):
        Path(os.environ["NEURONPACK_NXDI_REPORT"]).write_text(json.dumps(
            {name: agreement(results[name], references[name]) for name in runs if references[name] is not None},
            indent=1))
    return {name: (results[name], references[name]) for name in runs}


def agreement(result: dict, reference) -> dict:
    """NxDI's figures against the reference: rows, top-1 agreeing rows, max |logit difference|."""
    assert "error" not in result, result["error"]
    logits = result["logits"]
    return {"rows": len(reference), "top1": int((logits.argmax(-1) == reference.argmax(-1)).sum()),
            "max_abs_dlogit": float((logits - reference).abs().max())}


def _judged(families, name: str) -> dict:
    result, reference = families[name]
    assert "error" not in result, f"NxDI refused {name}: {result['error']}"
    assert result["closed_calls"] == [], f"closed Neuron code ran on the CPU path: {result['closed_calls']}"
    return agreement(result, reference)


@pytest.mark.parametrize("family", [*sorted(RECIPES), "qwen3 transformers-5 config"])
def test_nxdis_own_class_agrees_with_transformers(families, family):
    figures = _judged(families, family)
    assert figures["top1"] == figures["rows"] == len(TOKENS) - PROMPT_LEN + 1, figures
    assert figures["max_abs_dlogit"] < 1e-4, figures


@pytest.mark.parametrize("case", sorted(QUANTIZED))
def test_quantized_family_loads_through_nxdis_quantized_layers(families, case):
    """Routers, experts, sinks and norms stayed float (NxDI's converters would have refused or mis-loaded them
    otherwise); what was quantized loads into NxD's Quantized* layers and equals the dequantized weights."""
    figures = _judged(families, case)
    assert any(name.startswith("Quantized") for name in families[case][0]["modules"])
    assert figures["top1"] == figures["rows"] and figures["max_abs_dlogit"] < 1e-4, figures


def test_moe_families_ran_nxdis_expert_layers(families):
    for family in ("qwen3_moe", "gpt_oss", "llama4"):
        modules = families[family][0]["modules"]
        assert any("Expert" in m for m in modules), (family, sorted(modules))


def test_gemma3_judge_refuses_nxdi_090(families):
    """The Gemma 3 judge's CPU run (backends/nxd/defects.py) on NxDI 0.9.0 as pinned: the two defects show, so the
    verdict refuses (the accepting half, with the defects fixed, runs through `compile`: test_nxdi_family_eval.py)."""
    verdict = families["gemma3 judge"][0]["verdict"]
    assert not verdict["accepted"] and verdict["ran"], verdict
    agree, rows = (int(v) for v in verdict["detail"].split(" top-1")[0].split(" of "))
    assert rows == 19 and agree < rows, verdict


def test_the_harness_substitution_is_an_upstream_limit_outside_it(families):
    """With upstream's own layer-boundary markers (XLA custom calls), neuronpack's check says Qwen3-MoE cannot be
    scored on the CPU and names them; with the harness's identity it runs (the figures above)."""
    from tests.upstream import closed_shim

    result = families["qwen3_moe limits"][0]
    assert "layer-boundary markers" in result["upstream"] and "layer_boundary_marker.py:18" in result["upstream"]
    assert result["harness"] is None
    assert [name.rsplit(".", 2)[-2] for name in closed_shim.SUBSTITUTED] == ["ModuleMarkerStartWrapper",
                                                                               "ModuleMarkerEndWrapper"]

