"""Which tensors get quantized, --skip globs, modules_to_not_convert and refusal of quantized inputs (torch-free)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from neuronpack.convert.quant_plan import (
    check_not_quantized,
    modules_to_not_convert,
    plan_quantization,
    skip_matches,
)
from neuronpack.errors import QuantizationError


class Info(NamedTuple):
    dtype: str
    shape: tuple[int, ...]


LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def llama_infos(layers: int = 2, *, tied: bool = False, dtype: str = "BF16") -> dict[str, Info]:
    infos = {"model.embed_tokens.weight": Info(dtype, (100, 8))}
    for i in range(layers):
        infos[f"model.layers.{i}.input_layernorm.weight"] = Info(dtype, (8,))
        for lin in LINEARS:
            infos[f"model.layers.{i}.{lin}.weight"] = Info(dtype, (8, 8))
        infos[f"model.layers.{i}.self_attn.q_proj.bias"] = Info(dtype, (8,))
    infos["model.norm.weight"] = Info(dtype, (8,))
    if not tied:
        infos["lm_head.weight"] = Info(dtype, (100, 8))
    return infos


def test_default_plan_quantizes_every_decoder_linear_only():
    plan = plan_quantization(llama_infos(), {})
    assert len(plan.quantize) == 14
    assert all(n.startswith("model.layers.") and n.endswith("_proj.weight") for n in plan.quantize)
    assert plan.modules_to_not_convert == ("lm_head",)
    assert plan.unmatched_skips == () and not plan.lm_head_tied


def test_include_lm_head_quantizes_an_untied_head_and_unties_a_tied_one():
    assert "lm_head.weight" in plan_quantization(llama_infos(), {}, include_lm_head=True).quantize
    assert plan_quantization(llama_infos(), {}, include_lm_head=True).modules_to_not_convert == ()
    assert plan_quantization(llama_infos(), {}, include_lm_head=True).untie_from is None
    tied = plan_quantization(llama_infos(tied=True), {}, include_lm_head=True)
    assert tied.lm_head_tied and "lm_head.weight" not in tied.quantize
    assert tied.untie_from == "model.embed_tokens.weight" and tied.modules_to_not_convert == ()
    kept = plan_quantization(llama_infos(tied=True), {}, include_lm_head=True, skip=("lm_head",))
    assert kept.untie_from is None and kept.modules_to_not_convert == ("lm_head",)
    assert plan_quantization(llama_infos(tied=True), {}).untie_from is None


@pytest.mark.parametrize(
    "glob, prefix, expected",
    [
        ("layers.0.mlp", "model.layers.0.mlp.up_proj", True),  # NxDI-style ancestor, no "model."
        ("model.layers.0.*", "model.layers.0.self_attn.q_proj", True),
        ("*.down_proj", "model.layers.1.mlp.down_proj", True),
        ("model.layers.1.mlp.down_proj", "model.layers.1.mlp.down_proj", True),
        ("layers.1", "model.layers.10.mlp.up_proj", False),  # no accidental prefix match of layer 10
        ("layers.0.mlp", "model.layers.0.self_attn.q_proj", False),
        ("lm_head", "lm_head", True),
    ],
)
def test_skip_globs_match_module_and_ancestors(glob, prefix, expected):
    assert skip_matches(glob, prefix) is expected


def test_skip_collapses_whole_groups_and_reports_unmatched_globs():
    plan = plan_quantization(llama_infos(), {}, skip=("layers.0.mlp", "*.1.self_attn.q_proj", "nope.*"))
    assert plan.modules_to_not_convert == ("layers.0.mlp", "layers.1.self_attn.q_proj", "lm_head")
    assert plan.unmatched_skips == ("nope.*",)
    assert "model.layers.0.mlp.up_proj.weight" not in plan.quantize
    assert len(plan.quantize) == 14 - 3 - 1


def test_modules_to_not_convert_never_collapses_to_a_layer():
    all_linear = [f"model.layers.1.{lin}" for lin in LINEARS]
    assert modules_to_not_convert(all_linear, all_linear) == ["layers.1.self_attn", "layers.1.mlp"]


def test_everything_skipped_or_no_linear_is_refused():
    with pytest.raises(QuantizationError, match="nothing left to quantize"):
        plan_quantization(llama_infos(), {}, skip=("*",))
    no_linear = {"model.embed_tokens.weight": Info("F32", (10, 4)), "model.norm.weight": Info("F32", (4,))}
    with pytest.raises(QuantizationError, match="no Linear weights"):
        plan_quantization(no_linear, {})


@pytest.mark.parametrize(
    "infos, config, match",
    [
        ({"model.layers.0.mlp.up_proj.weight": Info("I8", (8, 8))}, {}, "is I8"),
        ({"model.layers.0.mlp.up_proj.weight": Info("F8_E4M3", (8, 8))}, {}, "is F8_E4M3"),
        ({"model.layers.0.mlp.up_proj.scale": Info("F32", (8, 1))}, {}, "quantization tensor"),
        (llama_infos(), {"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
        (llama_infos(), {"quantization": {"method": "neuronpack-symmetric"}}, "'quantization' section"),
    ],
)
def test_already_quantized_inputs_are_refused(infos, config, match):
    with pytest.raises(QuantizationError, match=match) as info:
        check_not_quantized(infos, config, where="ckpt")
    assert info.value.where == "ckpt" and "original floating-point" in info.value.fix


def test_float_checkpoint_passes_the_quantized_check():
    check_not_quantized(llama_infos(), {"torch_dtype": "bfloat16"}, where="ckpt")
