"""int8 weights with bfloat16 compute, a prefill's rows (more than 16): torch.ops.neuronpack.linear_int8 never
converts the whole weight (kernels/int8_gemm.cpp). Up to 128 rows it runs torch's integer GEMM on two int8 rows per
row of x, more rows a bfloat16 GEMM per cache-sized tile of the weights converted to bfloat16. Each result is the
float reference's to within that rounding of x (two int8 rows: max|x[m]| / 64516 per element) and bfloat16's
rounding of y, for any shape, scale, bias and thread count, either path; rows holding an inf or a NaN, K = 1 and K
past the int32 bound take the float path; a model on the kernels is as close to float32 as the float path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuronpack.kernels import load_kernels
from neuronpack.models import load_model
from neuronpack.models.linear_kernels import use_kernels
from neuronpack.models.quant import Int8Linear

X_STEP = 1 / 64516  # two int8 digits of a row: the largest error of an element, relative to the row's largest


@pytest.fixture(scope="module", autouse=True)
def kernels():
    load_kernels()


@pytest.fixture(params=["by rows", "tiles", "two int8 rows"])
def path(request):
    """Each way bfloat16 rows can go (torch.ops.neuronpack.set_int8_bf16_prefill): the default by row count, and
    each path forced for every row count. The setting holds for the whole hypothesis run of a test."""
    before = torch.ops.neuronpack.set_int8_bf16_prefill({"by rows": -1, "tiles": 0, "two int8 rows": 1}[request.param])
    yield request.param
    torch.ops.neuronpack.set_int8_bf16_prefill(before)


def _reference(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(x @ w.T) * scale + bias in float64 (bfloat16 x and bias are exact there), [M, N]."""
    rows = x.reshape(-1, x.shape[-1]).double()
    y = rows @ w.double().T * scale.double().reshape(1, -1)
    return y + bias.double() if bias is not None else y


def _within_bound(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, ref: torch.Tensor,
                  bias: torch.Tensor | None = None) -> bool:
    """|y - ref| <= the rounding of x to two int8 digits per row (max|x[m]| / 64516 per element, times sum|w[n]| *
    scale[n]) + the roundings to bfloat16 (the tiles round the GEMM's result, then y: 2^-9 of each) + float32's
    own (1e-6 of the magnitudes)."""
    rows = x.reshape(-1, x.shape[-1]).double()
    w_mass = (w.double().abs().sum(-1) * scale.double().reshape(-1)).reshape(1, -1)
    x_part = rows.abs().amax(-1, keepdim=True) * X_STEP * w_mass * 1.001
    magnitude = rows.abs() @ w.double().abs().T * scale.double().reshape(1, -1)
    unbiased = ref - bias.double() if bias is not None else ref
    bound = x_part + (ref.abs() + unbiased.abs() + 2 * x_part) * 2.0 ** -8 + 1e-6 * magnitude + 1e-30
    return bool(((y.reshape(ref.shape).double() - ref).abs() <= bound).all())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(17, 200), k=st.integers(2, 700), n=st.integers(1, 70), per_tensor=st.booleans(),
       bias=st.sampled_from([None, torch.bfloat16, torch.float32]), threads=st.sampled_from([1, 2]))
def test_bf16_rows_against_int8_weights_match_the_reference(path, rows, k, n, per_tensor, bias, threads):
    gen = torch.Generator().manual_seed(rows * 7919 + k * 31 + n)
    x = (torch.randn(rows, k, generator=gen) * torch.rand(rows, 1, generator=gen) * 10).bfloat16()
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(1 if per_tensor else n, 1, generator=gen) / 50
    b = torch.randn(n, generator=gen).to(bias) if bias else None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = torch.ops.neuronpack.linear_int8(x, w, scale, b)
    finally:
        torch.set_num_threads(before)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    assert _within_bound(y, x, w, scale, _reference(x, w, scale, b), b)


def test_mixed_magnitudes_leading_dims_and_strided_input(path):
    """A row of huge values, one of tiny ones and an outlier each keep their own scale; [b, T, K] inputs and a
    non-contiguous view give the same rows' results; zeros give zeros."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 80, 576, generator=gen)
    x[0, 0] *= 1e4
    x[0, 1] *= 1e-6
    x[1, -1, 288] = 500.0
    x = x.bfloat16()
    w = torch.randint(-127, 128, (96, 576), dtype=torch.int8, generator=gen)
    scale = torch.rand(96, 1, generator=gen) / 50
    y = torch.ops.neuronpack.linear_int8(x, w, scale)
    assert y.shape == (2, 80, 96)
    assert _within_bound(y, x, w, scale, _reference(x, w, scale, None))
    strided = torch.ops.neuronpack.linear_int8(x.transpose(0, 1).contiguous().transpose(0, 1), w, scale)
    assert torch.equal(strided, y)
    for rows in (17, 200):
        assert (torch.ops.neuronpack.linear_int8(torch.zeros(rows, 576, dtype=torch.bfloat16), w, scale) == 0).all()


@pytest.mark.parametrize(("rows", "two_digits"), [(17, True), (128, True), (129, False), (494, False)])
def test_the_path_taken_by_row_count(rows, two_digits):
    """x = [1, 3e-3, then 8192 values of 2^-18]: two int8 digits of the row lose the 2^-18s (below 1/64516 of the
    largest value, once the 3e-3 sets the second digit's scale), which add up to 2^-5; the tiles (exact weights and x)
    keep them. y is 127 * (1 + 3e-3) / 128 ~ 0.9952 with two digits against 1.026: up to 128 rows take two int8
    rows, more the tiles."""
    k = 8194
    x = torch.full((rows, k), 2.0 ** -18)
    x[:, 0], x[:, 1] = 1.0, 3e-3
    x = x.bfloat16()
    w = torch.full((1, k), 127, dtype=torch.int8)
    y = torch.ops.neuronpack.linear_int8(x, w, torch.full((1, 1), 1 / 128)).float()
    exact = _reference(x, w, torch.full((1, 1), 1 / 128), None).float()
    expected = torch.full_like(y, 127 * (1 + x[0, 1].item()) / 128) if two_digits else exact
    assert torch.allclose(y, expected, rtol=2.0 ** -7, atol=0)
    if two_digits:  # and not the float path's
        assert (exact - y).abs().min() > 0.02


@pytest.mark.parametrize("k", [1, 131073])
def test_k_of_one_and_past_the_int32_bound_take_the_float_path(k):
    """K = 1 (torch 2.13's _int_mm is wrong for it) and K > 131072 (an int32 sum could overflow): the float path,
    with bfloat16's rounding of y only."""
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(17, k, generator=gen).bfloat16()
    w = torch.full((2, k), 127, dtype=torch.int8)
    scale = torch.full((2, 1), 1e-3)
    y = torch.ops.neuronpack.linear_int8(x, w, scale)
    ref = _reference(x, w, scale, None)
    magnitude = x.double().abs() @ w.double().abs().T * 1e-3
    assert y.dtype == torch.bfloat16
    assert ((y.double() - ref).abs() <= ref.abs() * 2.0 ** -7 + 1e-2 * magnitude).all()


@pytest.mark.parametrize("rows", [20, 200])
def test_rows_holding_inf_or_nan_take_the_float_path(rows):
    """A NaN in one row and an inf in another: the float path's result (the tiles' is the float path's arithmetic),
    NaN exactly where the float reference has it, the finite rows as before."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(rows, 64, generator=gen)
    x[2, 63] = float("nan")
    x[3, 0] = float("inf")
    x = x.bfloat16()
    w = torch.randint(-127, 128, (33, 64), dtype=torch.int8, generator=gen)
    scale = torch.rand(33, 1, generator=gen) / 50
    y = torch.ops.neuronpack.linear_int8(x, w, scale)
    ref = x.float() @ w.float().T * scale.reshape(1, -1)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    finite = ~torch.isnan(ref).any(-1)
    assert torch.allclose(y[finite].float(), ref[finite], rtol=2e-2, atol=2e-2)


def test_bf16_int8_model_prefill_on_kernels_is_as_close_to_float32_as_the_float_path(path, make_checkpoint):
    """A bfloat16 checkpoint quantized to int8, computed in bfloat16: a 40-token prefill on the kernels (int8_gemm.cpp)
    is as close to the same int8 model computed in float32 as the float path (weights converted to bfloat16, y
    rounded twice) is: bfloat16's rounding, not the two int8 digits of x, is what either path adds."""
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint

    path = make_checkpoint("llama", dtype="bfloat16")
    quantized = path.parent / "int8"
    quantize_checkpoint(path, quantized, QuantizeOptions("int8"))
    exact, model = load_model(quantized, torch.float32), load_model(quantized, torch.bfloat16)
    for seed in range(3):
        prompt = torch.randint(0, 384, (1, 40), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            reference = exact.forward_full(prompt)
            float_path = model.forward_full(prompt)
            use_kernels(model)
            assert any(m.kernel for m in model.modules() if isinstance(m, Int8Linear))
            on_kernels = model.forward_full(prompt)
            for m in model.modules():
                m.kernel = False
        ours, theirs = (on_kernels - reference).abs(), (float_path - reference).abs()
        assert ours.mean() <= 1.25 * theirs.mean() and ours.max() <= 1.5 * theirs.max()
        assert (on_kernels.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9
