"""neuronpack's routed experts (neuronpack/kernels/moe.cpp): torch.ops.neuronpack.routed_experts computes what the
torch reference (models/moe_reference.py) computes, for every weight format (float32, bfloat16, int8 with
per-channel scales, MXFP4 against float32 and bfloat16 x), a decode step's few rows (the register kernels) and a
prefill's many (experts with more than 16 tokens run GEMMs), both activations (SwiGLU, gpt-oss's clamped one),
biases, 1 and 2 threads; experts no token chose never enter a result."""

from __future__ import annotations

import math

import pytest
import torch

from neuronpack.kernels import load_kernels
from neuronpack.models import mxfp4
from neuronpack.models.moe_reference import routed_experts_reference

SWIGLU = (1.0, 0.0, 0.0)  # no limit, as the model passes it (0: an AOTInductor package holds no inf)
GPT_OSS = (1.702, 7.0, 1.0)
# of the output's largest magnitude; int8: a prefill's GEMMs round x to two int8 rows (kernels/int8_gemm.cpp: an
# error of max|x| / 64516 per element)
TOLERANCE = {"float32": 2e-6, "bfloat16": 2e-2, "int8": 1e-4, "mxfp4": 2e-6, "mxfp4-bf16": 2e-2}
# mxfp4-bf16: MXFP4 weights, bfloat16 x (rounded to 16-bit integers per row on CPUs with AVX512_VNNI)


@pytest.fixture(scope="module", autouse=True)
def kernels():
    load_kernels()


def experts(fmt: str, n_experts: int, hidden: int, inter: int, gen: torch.Generator, bias: bool):
    """Random stacked experts in ``fmt``: (gate_up, down, gate_up_scale, down_scale, gate_up_bias, down_bias)."""
    gate_up = torch.randn(n_experts, 2 * inter, hidden, generator=gen) / math.sqrt(hidden)
    down = torch.randn(n_experts, hidden, inter, generator=gen) / math.sqrt(inter)
    scales = (None, None)
    if fmt == "int8":
        scales = tuple(w.abs().amax(-1) / 127 for w in (gate_up, down))  # [E, rows]
        gate_up, down = ((w / s[..., None]).round().to(torch.int8)
                         for w, s in zip((gate_up, down), scales, strict=True))
    elif fmt.startswith("mxfp4"):
        (gate_up, gs), (down, ds) = mxfp4.quantize(gate_up), mxfp4.quantize(down)
        scales = (gs, ds)
    else:
        gate_up, down = gate_up.to(getattr(torch, fmt)), down.to(getattr(torch, fmt))
    biases = (torch.randn(n_experts, 2 * inter, generator=gen), torch.randn(n_experts, hidden, generator=gen)) \
        if bias else (None, None)
    return (gate_up, down, *scales, *biases)


def routing(tokens: int, n_experts: int, k: int, gen: torch.Generator):
    weights, ids = torch.softmax(torch.randn(tokens, n_experts, generator=gen), -1).topk(k, -1)
    return ids, weights


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8", "mxfp4", "mxfp4-bf16"])
@pytest.mark.parametrize("tokens", [1, 3, 16, 40])  # 40 tokens of top-2 over 4 experts: ~20 per expert, GEMMs
def test_routed_experts_match_the_reference(fmt, tokens, threads):
    gen = torch.Generator().manual_seed(tokens * 10 + threads)
    dtype = torch.bfloat16 if fmt in ("bfloat16", "mxfp4-bf16") else torch.float32
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for n_experts, hidden, inter, k, bias, act in ((4, 64, 32, 2, True, GPT_OSS), (8, 96, 160, 3, False, SWIGLU)):
            x = torch.randn(tokens, hidden, generator=gen).to(dtype)
            ids, weights = routing(tokens, n_experts, k, gen)
            args = (x, ids, weights, *experts(fmt, n_experts, hidden, inter, gen, bias), *act)
            y = torch.ops.neuronpack.routed_experts(*args)
            ref = routed_experts_reference(*args)
            assert y.dtype == dtype and y.shape == x.shape
            assert (y.float() - ref.float()).abs().max() <= TOLERANCE[fmt] * ref.float().abs().max()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8", "mxfp4", "mxfp4-bf16"])
def test_experts_no_token_chose_never_enter_a_result(fmt):
    """Every expert no token routes to holds NaN: a kernel computing all experts and masking the results (NaN * 0)
    would give NaN."""
    gen = torch.Generator().manual_seed(3)
    dtype = torch.bfloat16 if fmt in ("bfloat16", "mxfp4-bf16") else torch.float32
    gate_up, down, gs, ds, gb, db = experts(fmt, 6, 64, 32, gen, bias=True)
    chosen = torch.tensor([[1, 4], [4, 1], [1, 4]])
    for t in (gate_up, down, gs, ds, gb, db):
        if t is not None:
            unused = torch.ones(t.shape[0], dtype=torch.bool)
            unused[chosen.unique()] = False
            t[unused] = 255 if t.dtype == torch.uint8 else (0 if t.dtype == torch.int8 else float("nan"))
    x = torch.randn(3, 64, generator=gen).to(dtype)
    weights = torch.tensor([[0.7, 0.3], [0.5, 0.5], [0.1, 0.9]])
    y = torch.ops.neuronpack.routed_experts(x, chosen, weights, gate_up, down, gs, ds, gb, db, *GPT_OSS)
    assert torch.isfinite(y).all()
    assert torch.allclose(y.float(), routed_experts_reference(x, chosen, weights, gate_up, down, gs, ds, gb, db,
                                                              *GPT_OSS).float(), rtol=0, atol=2e-2)


def test_bad_arguments_are_refused_with_what_is_wrong():
    gen = torch.Generator().manual_seed(4)
    gate_up, down, *_ = experts("float32", 4, 64, 32, gen, bias=False)
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="outside 0..3"):
        torch.ops.neuronpack.routed_experts(x, torch.tensor([[0, 4], [1, 2]]), torch.ones(2, 2), gate_up, down,
                                            None, None, None, None, *SWIGLU)
    with pytest.raises(RuntimeError, match="x is Float"):
        torch.ops.neuronpack.routed_experts(x, torch.tensor([[0, 1], [1, 2]]), torch.ones(2, 2),
                                            gate_up.bfloat16(), down.bfloat16(), None, None, None, None, *SWIGLU)


@pytest.mark.parametrize("fmt", ["int8", "mxfp4-bf16"])
def test_a_token_holding_nan_gives_nan_as_the_reference_does(fmt):
    """Formats that round x to integers (MXFP4 against bfloat16 x) take the float path when x is not finite."""
    gen = torch.Generator().manual_seed(5)
    dtype = torch.bfloat16 if fmt == "mxfp4-bf16" else torch.float32
    weights = experts(fmt, 4, 64, 32, gen, bias=False)
    x = torch.randn(2, 64, generator=gen).to(dtype)
    x[0, 3] = float("nan")
    ids, w = routing(2, 4, 2, gen)
    y = torch.ops.neuronpack.routed_experts(x, ids, w, *weights, *SWIGLU)
    ref = routed_experts_reference(x, ids, w, *weights, *SWIGLU)
    assert torch.isnan(y[0]).all() and torch.isnan(ref[0]).all()
    torch.testing.assert_close(y[1].float(), ref[1].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp4-bf16", "bfloat16"])
@pytest.mark.parametrize("rows", [16, 1 << 20])
def test_gemms_and_register_kernels_agree_past_16_tokens_an_expert(fmt, rows):
    """By default MXFP4 experts run the register kernels for any number of tokens, float and int8 ones GEMMs past
    16; set_moe_gemm_rows moves the line (16: MXFP4 through its dequantized GEMMs too; 2^20: bfloat16 through the
    register kernels)."""
    gen = torch.Generator().manual_seed(6)
    dtype = torch.float32 if fmt == "mxfp4" else torch.bfloat16
    weights = experts(fmt, 4, 64, 32, gen, bias=True)
    x = torch.randn(48, 64, generator=gen).to(dtype)  # 48 tokens, top 2 of 4: ~24 an expert
    ids, w = routing(48, 4, 2, gen)
    before = torch.ops.neuronpack.set_moe_gemm_rows(rows)
    try:
        y = torch.ops.neuronpack.routed_experts(x, ids, w, *weights, *GPT_OSS)
    finally:
        torch.ops.neuronpack.set_moe_gemm_rows(before)
    ref = routed_experts_reference(x, ids, w, *weights, *GPT_OSS)
    assert (y.float() - ref.float()).abs().max() <= TOLERANCE[fmt] * ref.float().abs().max()
