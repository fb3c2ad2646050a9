"""Weight-only quantized checkpoints (NxDI format, written by neuronpack's own quantizer): int8 runs as int8
through torch._weight_int8pack_mm, fp8 is dequantized at load with a warning; both match transformers with the
dequantized weights."""

from __future__ import annotations

import pytest
import torch
import transformers

from neuronpack.checkpoint import open_checkpoint
from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint
from neuronpack.models import load_model, quantized_linears
from neuronpack.models.quant import GEMV_MAX_ROWS, Int8Linear, int8_gemv
from neuronpack.progress import NullReporter


def dequantized_reference(original, quantized):
    """transformers model of ``original`` with every quantized linear replaced by weight * scale."""
    ref = transformers.AutoModelForCausalLM.from_pretrained(original, attn_implementation="eager").eval()
    ckpt = open_checkpoint(quantized)
    params = dict(ref.named_parameters())
    with torch.no_grad():
        for prefix in quantized_linears(ckpt):
            w = ckpt.get(f"{prefix}.weight").float() * ckpt.get(f"{prefix}.scale").float()
            params[f"{prefix}.weight"].copy_(w)
    return ref


@pytest.mark.parametrize(("dtype", "granularity"), [("int8", "per-channel"), ("int8", "per-tensor"),
                                                    ("fp8", "per-channel")])
def test_quantized_model_matches_dequantized_reference(make_checkpoint, tmp_path, dtype, granularity):
    original = make_checkpoint("qwen2")  # q/k/v biases ride along with quantized weights
    quantized = quantize_checkpoint(original, tmp_path / "q", QuantizeOptions(dtype, granularity)).out
    reporter = NullReporter()
    model = load_model(quantized, torch.float32, reporter=reporter)
    int8_layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    if dtype == "int8":
        assert len(int8_layers) == 14 and int8_layers[0].weight.dtype == torch.int8  # 7 linears x 2 layers
        assert not reporter.warnings
    else:
        assert not int8_layers and "fp8" in reporter.warnings[0]
    tokens = torch.randint(0, 384, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = dequantized_reference(original, quantized)(tokens).logits
        got = model.forward_full(tokens)
    torch.testing.assert_close(got, expected, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("lead", [(1, 1), (2, 1), (8, 1), (3, 5)])  # decode rows (reduction form) and context rows
def test_int8_linear_bfloat16_activations(lead):
    torch.manual_seed(0)
    layer = Int8Linear(64, 32, bias=True)
    w = torch.randint(-127, 128, (32, 64), dtype=torch.int8)
    scale = torch.rand(32, 1) / 100
    layer.load_state_dict({"weight": w, "scale": scale, "bias": torch.randn(32)}, assign=True)
    x = torch.randn(*lead, 64)
    expected = x @ (w.float() * scale).T + layer.bias
    torch.testing.assert_close(layer(x), expected, atol=1e-4, rtol=1e-4)
    got_bf16 = layer.to(torch.bfloat16)(x.bfloat16())
    assert got_bf16.dtype == torch.bfloat16
    torch.testing.assert_close(got_bf16.float(), expected, atol=0.1, rtol=0.05)


def test_int8_gemv_is_the_integer_matmul():
    rows = torch.randn(4, 96)
    weight = torch.randint(-127, 128, (40, 96), dtype=torch.int8)
    # Sums of ~96 products of magnitude ~100: only the summation order differs from the float32 matmul.
    torch.testing.assert_close(int8_gemv(rows, weight), rows @ weight.float().T, atol=1e-3, rtol=1e-4)
    expected_bf16 = rows.bfloat16().float() @ weight.float().T  # bf16 rows, float32 accumulation
    torch.testing.assert_close(int8_gemv(rows.bfloat16(), weight), expected_bf16, atol=1e-3, rtol=1e-4)


def test_int8_linear_compiles_in_both_forms_for_bfloat16():
    """The two forms inductor sees (few rows: reduction; many rows: dequantize + matmul) compile for bfloat16
    activations fed by a pointwise op, the case that raised LoweringException with torch._weight_int8pack_mm."""
    torch.manual_seed(0)
    layer = Int8Linear(64, 32)
    layer.load_state_dict({"weight": torch.randint(-127, 128, (32, 64), dtype=torch.int8),
                           "scale": torch.rand(32, 1) / 100}, assign=True)
    norm = torch.rand(64, dtype=torch.bfloat16)

    def forward(x):
        return layer(x * norm)  # a bf16 pointwise result feeds the int8 linear, as RMSNorm does in the model

    compiled = torch.compile(forward, fullgraph=True, dynamic=False)
    for rows in (1, GEMV_MAX_ROWS.get(torch.bfloat16, 4) + 12):
        x = torch.randn(rows, 64, dtype=torch.bfloat16)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x).float(), forward(x).float(), atol=0.05, rtol=0.02)
