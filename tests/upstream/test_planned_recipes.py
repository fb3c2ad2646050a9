"""Upstream NxD Inference judges the planner: every shipped nxd recipe (Llama text), planned by `neuronpack buckets
plan --write` for the shared-prefix trace, compiles (--dry-run) to NeuronConfig kwargs that NxDI 0.9.0's own
NeuronConfig accepts, keeping exactly the planned buckets (it asserts each list's largest <= its maximum and sorts
them)."""

from __future__ import annotations

import json
import shutil
import subprocess

from tests.upstream.test_nxdi_cpu import NP, ROOT, _recorded_neuron_config, nxdi_recipes, nxdi_setup

TRAFFIC = ROOT / "bench" / "traces" / "shared-prefix.jsonl"
CHECK = """
import json, sys
sys.path[:0] = [sys.argv[1], *json.loads(sys.argv[2])]
import closed_shim
closed_shim.install()
from neuronx_distributed_inference.models.config import NeuronConfig
closed_shim.seal()
out = {}
for name, cfg in json.loads(open(sys.argv[3]).read()).items():
    nc = NeuronConfig(**cfg)
    out[name] = [nc.context_encoding_buckets, nc.token_generation_buckets, nc.max_context_length, nc.seq_len]
print(json.dumps(out))
"""


def test_nxdi_neuron_config_accepts_every_planned_nxd_recipe(tmp_path_factory):
    sources, python, work, llama = nxdi_setup(tmp_path_factory, "planned")
    configs, planned = {}, {}
    for recipe in nxdi_recipes():
        if "eagle" in recipe.stem:  # its draft is not needed to plan; dry-run needs one
            continue
        copy = work / recipe.name
        shutil.copy(recipe, copy)
        done = subprocess.run([*NP, "buckets", "plan", "--traffic", str(TRAFFIC), "--recipe", str(copy), "--write",
                               "--format", "json"], capture_output=True, text=True, check=True)
        planned[recipe.stem] = json.loads(done.stdout)["planned"]
        configs[recipe.stem] = _recorded_neuron_config(llama, copy, work / "root")
    spec = work / "configs.json"
    spec.write_text(json.dumps(configs))
    done = subprocess.run([str(python), "-c", CHECK, str(ROOT / "tests" / "upstream"),
                           json.dumps([str(s) for s in sources]), str(spec)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    accepted = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(accepted) == set(planned) and len(planned) >= 3
    for name, (context, token_generation, _, _) in accepted.items():
        assert context == planned[name]["context"] and token_generation == planned[name]["token_generation"]


