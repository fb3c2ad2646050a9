"""Experts read from each checkpoint layout (models/moe_checkpoint.py) compute what transformers' own experts module
computes on the same checkpoint: Qwen3-MoE and Mixtral per expert (transformers' default save) and fused
(``save_original_format=False``), gpt-oss as transformers writes it (transposed, gate / up interleaved) and in its
released MXFP4 layout (kept as uint8 blocks and scales: 4.25 bits per weight)."""

from __future__ import annotations

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from neuronpack.checkpoint import open_checkpoint
from neuronpack.errors import CheckpointError
from neuronpack.kernels import load_kernels
from neuronpack.models.moe_checkpoint import expert_format, read_experts
from neuronpack.models.moe_config import ExpertNames
from neuronpack.models.moe_reference import routed_experts_reference
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
    assert expert_format(open_checkpoint(path), prefixes, names) == ("mxfp4" if layout == "mxfp4" else "float")
    if layout == "mxfp4":  # compact at rest: the blocks and scales, not a widened copy
        assert tensors["gate_up.weight"].dtype == torch.uint8 and tensors["gate_up.weight"].shape == (8, 64, 2, 16)
        assert tensors["gate_up.scale"].shape == (8, 64, 2)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=gen)
    weights, ids = torch.softmax(torch.randn(5, 8, generator=gen), -1).topk(2, -1)
    act = (experts.alpha, experts.limit, 1.0) if family == "gpt_oss" else (1.0, float("inf"), 0.0)
    args = (x, ids, weights, tensors["gate_up.weight"], tensors["down.weight"], tensors.get("gate_up.scale"),
            tensors.get("down.scale"), tensors.get("gate_up.bias"), tensors.get("down.bias"), *act)
    with torch.no_grad():
        want = experts(x, ids, weights)
    torch.testing.assert_close(torch.ops.neuronpack.routed_experts(*args), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(routed_experts_reference(*args), want, rtol=1e-5, atol=1e-5)


def test_int8_experts_stay_int8_with_their_scales(tmp_path):
    """Per-expert int8 linears in NxD Inference's format (``.weight`` int8, ``.scale`` [rows, 1] float32), as a
    quantizer writes them: stacked as int8 with their scales, not widened."""
    src = make_tiny_moe_checkpoint(tmp_path / "mixtral", "mixtral")
    tensors = load_file(src / "model.safetensors")
    for name in [n for n in tensors if ".experts." in n]:
        w = tensors.pop(name)
        scale = w.abs().amax(-1, keepdim=True) / 127
        tensors[name] = (w / scale).round().to(torch.int8)
        tensors[name[: -len("weight")] + "scale"] = scale
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    names, prefixes = ExpertNames(gate="w1", up="w3", down="w2"), ["model.layers.1.block_sparse_moe"]
    ckpt = open_checkpoint(src)
    assert expert_format(ckpt, prefixes, names) == "int8"
    read = read_experts(ckpt, prefixes, names, torch.float32)
    assert read["gate_up.weight"].dtype == torch.int8 and read["gate_up.scale"].shape == (8, 64)
    expert = "model.layers.1.block_sparse_moe.experts.3"
    assert torch.equal(read["gate_up.weight"][3, :32], tensors[f"{expert}.w1.weight"])
    torch.testing.assert_close(read["down.scale"][3], tensors[f"{expert}.w2.scale"][:, 0])


def test_a_checkpoint_without_the_experts_is_refused(tmp_path):
    path = make_tiny_moe_checkpoint(tmp_path / "qwen3", "qwen3_moe")
    with pytest.raises(CheckpointError, match="no experts under model.layers.1.mlp"):
        read_experts(open_checkpoint(path), ["model.layers.1.mlp"], ExpertNames(), torch.float32)  # a dense layer


@pytest.mark.parametrize("include_experts", [False, True], ids=["experts float", "experts int8"])
def test_quantize_keeps_the_router_float_and_the_experts_as_asked(tmp_path, include_experts):
    """`neuronpack quantize` int8s a Qwen3-MoE checkpoint's attention, never its router (routing stays float); the
    experts stay float as NxD Inference needs them unless ``--include-experts`` (the portable backend's routed kernel
    reads int8 experts). Either way the model loads and predicts transformers' next tokens."""
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint
    from neuronpack.models.loading import load_model

    src = make_tiny_moe_checkpoint(tmp_path / "qwen3", "qwen3_moe")
    out = tmp_path / "qwen3-int8"
    quantize_checkpoint(src, out, QuantizeOptions("int8", include_experts=include_experts))
    ckpt = open_checkpoint(out)
    assert ckpt.info("model.layers.0.mlp.gate.weight").dtype == "F32"
    assert ckpt.info("model.layers.0.self_attn.q_proj.weight").dtype == "I8"
    want_format, want_dtype = ("int8", torch.int8) if include_experts else ("float", torch.float32)
    assert ckpt.info("model.layers.0.mlp.experts.5.up_proj.weight").dtype == ("I8" if include_experts else "F32")
    assert ("expert_mlps" in ckpt.config["quantization"]["modules_to_not_convert"]) is not include_experts
    model = load_model(out, torch.float32)
    assert model.config.moe.expert_format == want_format
    assert model.model.layers[0].mlp.experts.gate_up.weight.dtype == want_dtype
    tokens = torch.randint(3, 380, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = transformers.AutoModelForCausalLM.from_pretrained(src).eval()(tokens).logits
        assert torch.equal(model.forward_full(tokens).argmax(-1), want.argmax(-1))
