"""Experts read from each checkpoint layout (models/moe_checkpoint.py) compute what transformers' own experts module
computes on the same checkpoint: Qwen3-MoE and Mixtral per expert (transformers' default save) and fused
(``save_original_format=False``), gpt-oss as transformers writes it (transposed, gate / up interleaved) and in its
released MXFP4 layout (kept as uint8 blocks and scales: 4.25 bits per weight)."""

from __future__ import annotations

import pytest
import torch
import transformers

from neuronpack.checkpoint import open_checkpoint
from neuronpack.errors import CheckpointError
from neuronpack.kernels import load_kernels
from neuronpack.models.moe import routed_experts_reference
from neuronpack.models.moe_checkpoint import ExpertNames, read_experts
from tests.helpers.tiny_moe import make_tiny_moe_checkpoint

# (family, layout) -> where its block's experts are and how they are named; the activation's alpha, limit, offset
CASES = {
    ("qwen3_moe", "per_expert"): (["model.layers.0.mlp"], ExpertNames()),
    ("qwen3_moe", "fused"): (["model.layers.0.mlp"], ExpertNames()),
    ("mixtral", "per_expert"): (["model.layers.0.block_sparse_moe", "model.layers.0.mlp"],
                                ExpertNames(gate="w1", up="w3", down="w2")),
    ("mixtral", "fused"): (["model.layers.0.block_sparse_moe", "model.layers.0.mlp"],
                           ExpertNames(gate="w1", up="w3", down="w2")),
    ("gpt_oss", "per_expert"): (["model.layers.0.mlp"], ExpertNames(interleaved=True, transposed=True)),
    ("gpt_oss", "mxfp4"): (["model.layers.0.mlp"], ExpertNames(interleaved=True, transposed=True)),
}


@pytest.fixture(scope="module", autouse=True)
def kernels():
    load_kernels()


@pytest.mark.parametrize(("family", "layout"), list(CASES))
def test_each_layout_computes_what_transformers_experts_compute(tmp_path, family, layout):
    path = make_tiny_moe_checkpoint(tmp_path / family, family, layout=layout)
    prefixes, names = CASES[(family, layout)]
    tensors = read_experts(open_checkpoint(path), prefixes, names, torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    experts = hf.model.layers[0].mlp.experts
    if layout == "mxfp4":  # compact at rest: the blocks and scales, not a widened copy
        assert tensors["gate_up_proj"].dtype == torch.uint8 and tensors["gate_up_proj"].shape == (8, 64, 2, 16)
        assert tensors["gate_up_proj_scale"].shape == (8, 64, 2)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=gen)
    weights, ids = torch.softmax(torch.randn(5, 8, generator=gen), -1).topk(2, -1)
    act = (experts.alpha, experts.limit, 1.0) if family == "gpt_oss" else (1.0, float("inf"), 0.0)
    args = (x, ids, weights, tensors["gate_up_proj"], tensors["down_proj"], tensors.get("gate_up_proj_scale"),
            tensors.get("down_proj_scale"), tensors.get("gate_up_proj_bias"), tensors.get("down_proj_bias"), *act)
    with torch.no_grad():
        want = experts(x, ids, weights)
    torch.testing.assert_close(torch.ops.neuronpack.routed_experts(*args), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(routed_experts_reference(*args), want, rtol=1e-5, atol=1e-5)


def test_int8_experts_stay_int8_with_their_scales(tmp_path):
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint

    src = make_tiny_moe_checkpoint(tmp_path / "mixtral", "mixtral")
    out = tmp_path / "mixtral-int8"
    quantize_checkpoint(src, out, QuantizeOptions("int8"))
    names = ExpertNames(gate="w1", up="w3", down="w2")
    tensors = read_experts(open_checkpoint(out), ["model.layers.1.block_sparse_moe"], names, torch.float32)
    ref = read_experts(open_checkpoint(src), ["model.layers.1.block_sparse_moe"], names, torch.float32)
    assert tensors["gate_up_proj"].dtype == torch.int8 and tensors["gate_up_proj_scale"].shape == (8, 64)
    dequantized = tensors["gate_up_proj"].float() * tensors["gate_up_proj_scale"][..., None]
    assert (dequantized - ref["gate_up_proj"]).abs().max() <= ref["gate_up_proj"].abs().amax() / 127


def test_a_checkpoint_without_the_experts_is_refused(tmp_path):
    path = make_tiny_moe_checkpoint(tmp_path / "qwen3", "qwen3_moe")
    with pytest.raises(CheckpointError, match="no experts under model.layers.1.mlp"):
        read_experts(open_checkpoint(path), ["model.layers.1.mlp"], ExpertNames(), torch.float32)  # a dense layer
