"""Upstream NxD Inference judges the planner: every shipped nxd recipe (on a tiny checkpoint of its own family: Llama,
Qwen3, Qwen3-MoE, gpt-oss, Llama 4), planned by `neuronpack buckets plan --write` for the shared-prefix trace,
compiles (--dry-run) to NeuronConfig kwargs that NxDI 0.9.0's own NeuronConfig class of that family (MoENeuronConfig
for MoE) accepts, keeping exactly the planned buckets (it asserts each list's largest <= its maximum and sorts
them)."""

from __future__ import annotations

import json
import shutil
import subprocess

from tests.upstream.family_checkpoints import recipe_family, write_family_checkpoint
from tests.upstream.test_nxdi_cpu import NP, ROOT, nxdi_recipes, nxdi_setup

TRAFFIC = ROOT / "bench" / "traces" / "shared-prefix.jsonl"
CHECK = """
import json, sys
sys.path[:0] = [sys.argv[1], *json.loads(sys.argv[2])]
import closed_shim
closed_shim.install()
from neuronpack.accuracy import nxdi_cpu
from neuronpack.backends.neuron.common import import_class
from neuronpack.backends.nxd.families import FAMILIES
nxdi_cpu.nxdi_importable()
imported = nxdi_cpu.import_family_modules()
closed_shim.seal()
# NxDI's Llama 4 image-to-text module imports torchvision (via mllama): not here. Its Llama4NeuronConfig is a
# MoENeuronConfig adding nothing (modeling_llama4.py:64); its text class's NeuronConfig is that MoENeuronConfig.
text = {f.model_class: f.text_class for f in FAMILIES.values() if f.text_class}
out = {}
for name, (model_class, cfg) in json.loads(open(sys.argv[3]).read()).items():
    cls = import_class(model_class if model_class in imported else text[model_class])
    nc = cls.get_neuron_config_cls()(**cfg)
    out[name] = [nc.context_encoding_buckets, nc.token_generation_buckets, nc.max_context_length, nc.seq_len]
print(json.dumps(out))
"""


def test_nxdi_neuron_config_accepts_every_planned_nxd_recipe(tmp_path_factory):
    sources, python, work, llama = nxdi_setup(tmp_path_factory, "planned")
    configs, planned, checkpoints = {}, {}, {}
    for recipe in nxdi_recipes():
        if "eagle" in recipe.stem:  # its draft is not needed to plan; dry-run needs one
            continue
        copy = work / recipe.name
        shutil.copy(recipe, copy)
        done = subprocess.run([*NP, "buckets", "plan", "--traffic", str(TRAFFIC), "--recipe", str(copy), "--write",
                               "--format", "json"], capture_output=True, text=True, check=True)
        planned[recipe.stem] = json.loads(done.stdout)["planned"]
        family = recipe_family(recipe)
        if family and family not in checkpoints:
            checkpoints[family] = write_family_checkpoint(work / family, family)
        dry = json.loads(subprocess.run([*NP, "compile", str(checkpoints[family] if family else llama), "--recipe",
                                         str(copy), "--dry-run", "--format", "json", "--out-root", str(work / "root")],
                                        capture_output=True, text=True, check=True).stdout)
        configs[recipe.stem] = [dry["model_class"], dry["neuron_config"]]
    spec = work / "configs.json"
    spec.write_text(json.dumps(configs))
    done = subprocess.run([str(python), "-c", CHECK, str(ROOT / "tests" / "upstream"),
                           json.dumps([str(ROOT), *(str(s) for s in sources)]), str(spec)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    accepted = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(accepted) == set(planned) and len(planned) >= 3
    for name, (context, token_generation, _, _) in accepted.items():
        assert context == planned[name]["context"] and token_generation == planned[name]["token_generation"]


