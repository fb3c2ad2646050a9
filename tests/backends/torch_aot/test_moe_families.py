"""Qwen3-MoE, Mixtral and gpt-oss through compiled artifacts (AOTInductor graphs calling neuronpack's routed-experts
kernel, built by the pipeline): greedy tokens equal transformers' ``generate`` on checkpoints transformers itself
wrote, in each layout they ship in (Qwen3-MoE per expert, Mixtral fused, gpt-oss as transformers writes it and in
its released MXFP4 layout, kept in MXFP4), with prompts prefilled together (right padded) and decoded together at
different positions; one graph per kind of layer (dense / MoE, sliding / full)."""

from __future__ import annotations

import pytest
import transformers
from safetensors import safe_open

from neuronpack.backends.torch_aot import load_artifact
from tests.backends.torch_aot.test_generate import PROMPT_LENGTHS, greedy_batch, hf_greedy, random_prompts

pytestmark = pytest.mark.slow

# name -> (model_type, the layer graphs: one per kind of layer)
CASES = {
    "qwen3_moe": ("qwen3_moe", [0, 1, 0]),  # MoE, dense (mlp_only_layers), MoE
    "mixtral": ("mixtral", [0, 0]),
    "gpt_oss": ("gpt_oss", [0, 1]),  # sliding, full
    "gpt_oss-mxfp4": ("gpt_oss", [0, 1]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_moe_greedy_matches_transformers(family_artifact, name):
    art = family_artifact(name)
    lm = load_artifact(art.path)
    model_type, groups = CASES[name]
    assert lm.compiler == "aoti" and lm.config.model_type == model_type
    assert list(lm.config.layer_graphs) == groups
    reference = transformers.AutoModelForCausalLM.from_pretrained(art.checkpoint).eval()
    prompts = random_prompts(PROMPT_LENGTHS, seed=1)
    for prompt, tokens in zip(prompts, greedy_batch(lm, prompts), strict=True):
        assert tokens == hf_greedy(reference, prompt), f"{name}: prompt of {len(prompt)} tokens diverged"


def test_mxfp4_experts_stay_mxfp4_in_the_artifact(family_artifact):
    """The released layout's experts are carried as MXFP4 bytes (4.25 bits per weight), never widened."""
    art = family_artifact("gpt_oss-mxfp4")
    dtypes = {}
    for path in (art.path / "weights").glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            dtypes.update({name: f.get_slice(name).get_dtype() for name in f.keys()})  # noqa: SIM118
    experts = {n: d for n, d in dtypes.items() if ".experts." in n}
    assert experts["model.layers.0.mlp.experts.gate_up.weight"] == "U8"
    assert experts["model.layers.0.mlp.experts.down.scale"] == "U8"
    assert experts["model.layers.0.mlp.experts.down.bias"] == "F32"
