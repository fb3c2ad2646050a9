"""What NxD Inference keeps in float under int8 / fp8, per family, in the quantize plan (torch-free): MoE routers,
experts (listed by NxDI's module names), attention sinks and norms, gpt-oss's MXFP4 experts (the one quantized input
carried as it is), biased attention projections; Llama 4's text decoder quantized, its vision tower not. NxDI's own
quantized load judges the resulting checkpoints in tests/upstream/test_nxdi_families.py."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from neuronpack.convert.quant_plan import check_not_quantized, keeps_float, plan_quantization
from neuronpack.errors import QuantizationError


class Info(NamedTuple):
    dtype: str
    shape: tuple[int, ...]


def _layer(prefix: str, *, bias: bool = False, **extra: tuple[int, ...]) -> dict[str, Info]:
    infos = {f"{prefix}.input_layernorm.weight": Info("BF16", (8,))}
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        infos[f"{prefix}.self_attn.{proj}.weight"] = Info("BF16", (8, 8))
        if bias:
            infos[f"{prefix}.self_attn.{proj}.bias"] = Info("BF16", (8,))
    infos.update({f"{prefix}.{name}": Info("U8" if name.endswith(("_blocks", "_scales")) else "BF16", shape)
                  for name, shape in extra.items()})
    return infos


def qwen3_moe() -> dict[str, Info]:
    experts = {f"mlp.experts.{e}.{p}.weight": (8, 8) for e in range(2) for p in ("gate_proj", "up_proj", "down_proj")}
    return {**_layer("model.layers.0", **{"mlp.gate.weight": (2, 8)}, **experts),
            "lm_head.weight": Info("BF16", (9, 8))}


def gpt_oss() -> dict[str, Info]:
    return {**_layer("model.layers.0", bias=True, **{
        "mlp.router.weight": (4, 8), "mlp.router.bias": (4,), "self_attn.sinks": (4,),
        "mlp.experts.gate_up_proj_blocks": (4, 16, 1, 16), "mlp.experts.gate_up_proj_scales": (4, 16, 1),
        "mlp.experts.down_proj_blocks": (4, 8, 1, 16), "mlp.experts.down_proj_scales": (4, 8, 1)}),
        "lm_head.weight": Info("BF16", (9, 8))}


def llama4() -> dict[str, Info]:
    text = _layer("language_model.model.layers.0", **{
        "feed_forward.router.weight": (2, 8), "feed_forward.experts.gate_up_proj": (2, 8, 16),
        "feed_forward.experts.down_proj": (2, 8, 8), "feed_forward.shared_expert.gate_proj.weight": (8, 8)})
    dense = _layer("language_model.model.layers.1", **{"feed_forward.gate_proj.weight": (16, 8)})
    vision = {"vision_model.model.layers.0.self_attn.q_proj.weight": Info("BF16", (8, 8))}
    return {**text, **dense, **vision, "language_model.lm_head.weight": Info("BF16", (9, 8))}


MXFP4 = {"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}}


def test_qwen3_moe_quantizes_attention_and_keeps_router_and_experts_float():
    plan = plan_quantization(qwen3_moe(), {})
    assert plan.quantize == tuple(f"model.layers.0.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj",
                                                                                    "o_proj"))
    assert plan.modules_to_not_convert == ("lm_head", "expert_mlps")  # NxDI's module names


def test_gpt_oss_carries_mxfp4_and_quantizes_only_linears():
    """The MXFP4 experts are carried as they are, the router and sinks stay float; the biased attention projections
    are planned like any Linear (the nxd backend refuses to give those to NxDI: quant_plan.biased_projections)."""
    from neuronpack.convert.quant_plan import biased_projections

    infos = gpt_oss()
    check_not_quantized(infos, MXFP4, where="ckpt")  # the released MXFP4 experts are accepted as they are
    plan = plan_quantization(infos, MXFP4)
    assert plan.quantize == tuple(f"model.layers.0.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj",
                                                                                    "o_proj"))
    assert plan.modules_to_not_convert == ("lm_head", "expert_mlps")
    assert biased_projections(infos) == [f"model.layers.0.self_attn.{p}" for p in ("k_proj", "o_proj", "q_proj",
                                                                                    "v_proj")]
    skipped = plan_quantization(infos, MXFP4, include_lm_head=True, skip=("*.self_attn",))
    assert skipped.quantize == ("lm_head.weight",)
    assert skipped.modules_to_not_convert == ("layers.0.self_attn", "expert_mlps")
    for name in ("model.layers.0.mlp.router.weight", "model.layers.0.self_attn.sinks",
                 "model.layers.0.mlp.experts.down_proj_blocks"):
        assert keeps_float(name) is not None, name


def test_mxfp4_is_the_only_quantized_input_carried():
    infos = {**gpt_oss(), "model.layers.0.self_attn.q_proj.scale": Info("F32", (8, 1))}
    with pytest.raises(QuantizationError, match="already quantized"):
        check_not_quantized(infos, MXFP4, where="ckpt")
    int8 = {**gpt_oss(), "model.layers.0.mlp.router.weight": Info("I8", (4, 8))}
    with pytest.raises(QuantizationError, match="already quantized"):
        check_not_quantized(int8, MXFP4, where="ckpt")


def test_llama4_quantizes_its_text_decoder_only():
    plan = plan_quantization(llama4(), {})
    assert all(n.startswith("language_model.model.layers.") for n in plan.quantize)
    assert "language_model.model.layers.1.feed_forward.gate_proj.weight" in plan.quantize
    assert not any("router" in n or "expert" in n or "vision" in n for n in plan.quantize)
    assert plan.modules_to_not_convert == ("lm_head", "expert_mlps", "shared_experts")


@pytest.mark.parametrize(("name", "kept"), [
    ("model.layers.0.mlp.gate_proj.weight", False), ("model.layers.0.mlp.gate.weight", True),
    ("model.layers.0.block_sparse_moe.gate.weight", True), ("model.layers.0.mlp.shared_expert_gate.weight", True),
    ("model.layers.3.mlp.experts.7.down_proj.weight", True), ("model.layers.0.self_attn.o_proj.weight", False),
])
def test_router_and_expert_rule_is_general(name, kept):
    assert (keeps_float(name) is not None) is kept
