"""neuronpack's decode kernels (neuronpack/kernels/linear.cpp): torch.ops.neuronpack.linear / linear_int8 compute
what F.linear and the int8 reference compute, for every row count (the kernel up to 16 rows, at::linear beyond),
every width (a tail shorter than one vector), leading dims, bias, threads; a model that runs them matches
transformers; the library is built once per machine and reused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuronpack.kernels import _library_path, has_kernel, load_kernels
from neuronpack.models import load_model
from neuronpack.models.linear_kernels import use_kernels
from neuronpack.models.llama import Linear
from neuronpack.models.quant import Int8Linear

TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=3e-2, rtol=2e-2)}


@pytest.fixture(scope="module", autouse=True)
def kernels():
    load_kernels()


def _relative_error(y: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor) -> float:
    """Largest error relative to the sum of the magnitudes of the products (|x| @ |w|.T, + |bias|): the scale of
    float rounding in a dot product, which stays meaningful when the sum itself cancels to near zero."""
    return ((y.float() - ref).abs() / scale.clamp_min(1e-6)).max().item()


def _int8_error_ok(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, magnitude: torch.Tensor,
                   ref: torch.Tensor, dot_products: str, float_error: float = 1e-5) -> bool:
    """Whether y is ``ref`` to within float rounding (``float_error`` of ``magnitude``) plus, where 2-16 rows of x go
    through int8_rows.cpp (dot products on a CPU with AVX512_VNNI), the rounding of each row of x to int16:
    max|x[m]| * 2^-16 per element, times sum|w[n]| * scale[n]; more float32 rows (int8_gemm.cpp's two int8 rows per
    row of x) to max|x[m]| / 64516."""
    bound = float_error * magnitude
    rows = x.reshape(-1, x.shape[-1])
    step = None
    if dot_products != "widening" and 2 <= rows.shape[0] <= 16 and torch.backends.cpu.get_cpu_capability() != "AVX2":
        step = 2.0 ** -16
    if rows.shape[0] > 16 and x.dtype == torch.float32:  # int8_gemm.cpp: two int8 rows per row of x
        step = 1 / 64516
    if step is not None:
        x_step = rows.float().abs().amax(-1, keepdim=True) * step
        bound = bound + x_step * (w.float().abs().sum(-1) * scale.reshape(-1)).reshape(1, -1) * 1.001
    return bool(((y.float() - ref).abs() <= bound.reshape(ref.shape)).all())


@pytest.fixture(params=["dot products", "dot products, one stream", "widening"])
def dot_products(request):
    """bfloat16 weights run vdpbf16ps on CPUs with AVX512_BF16 and int8 weights vpdpbusd on AVX512_VNNI, else the
    widening kernels: test both here, and both ways the int8 kernel reads the weights (one stream with a prefetch, as
    on a Zen 5; four streams elsewhere). The setting holds for the whole hypothesis run of a test."""
    before = torch.ops.neuronpack.set_dot_products(request.param != "widening")
    streams = torch.ops.neuronpack.set_int8_one_stream(1 if request.param.endswith("one stream") else 0)
    yield request.param
    torch.ops.neuronpack.set_dot_products(before)
    torch.ops.neuronpack.set_int8_one_stream(streams)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 20), k=st.integers(1, 200), n=st.integers(1, 70), bias=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_linear_matches_f_linear(dot_products, rows, k, n, bias, dtype):
    gen = torch.Generator().manual_seed(rows * 1000 + k * 7 + n)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    y = torch.ops.neuronpack.linear(x, w, b)
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    scale = F.linear(x.float().abs(), w.float().abs(), None if b is None else b.float().abs())
    assert y.dtype == dtype and y.shape == (rows, n)
    assert _relative_error(y, ref, scale) < (1e-5 if dtype == torch.float32 else 1e-2)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 20), k=st.integers(1, 200), n=st.integers(1, 70), bias=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), per_tensor=st.booleans())
def test_linear_int8_matches_the_reference(dot_products, rows, k, n, bias, dtype, per_tensor):
    gen = torch.Generator().manual_seed(rows * 1000 + k * 7 + n)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(1 if per_tensor else n, 1, generator=gen) / 50
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    y = torch.ops.neuronpack.linear_int8(x, w, scale, b)
    ref = (x.float() @ w.float().T) * scale.reshape(1, -1)
    ref = ref + b.float() if b is not None else ref
    magnitude = (x.float().abs() @ w.float().abs().T) * scale.reshape(1, -1)
    magnitude = magnitude + b.float().abs() if b is not None else magnitude
    assert y.dtype == dtype and y.shape == (rows, n)
    assert _int8_error_ok(y, x, w, scale, magnitude, ref, dot_products, 1e-5 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("k", [2048, 9000])
def test_int8_one_row_long_rows_and_non_finite_values(dot_products, k):
    """One row of x on AVX512_VNNI (int8_row.cpp: up to 2048 columns x as digit rows through vpdpbusd, longer rows
    as two int16 rows through vpdpwssd, over more than one int32 accumulation block), large and tiny magnitudes, and
    inf / NaN (which take the float kernel) all give the float32 reference's result."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randint(-127, 128, (37, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(37, 1, generator=gen) / 50
    for x in (torch.randn(1, k, generator=gen) * 1e4, torch.randn(1, k, generator=gen) * 1e-6,
              torch.zeros(1, k)):
        ref = (x @ w.float().T) * scale.reshape(1, -1)
        magnitude = (x.abs() @ w.float().abs().T) * scale.reshape(1, -1)
        assert _relative_error(torch.ops.neuronpack.linear_int8(x, w, scale), ref, magnitude) < 1e-5
    x = torch.randn(1, k, generator=gen)
    x[0, 5] = float("inf")
    x[0, 7] = float("nan")
    y = torch.ops.neuronpack.linear_int8(x, w, scale)
    assert torch.isnan(y).all()
    for where in (3, k - 1):  # a NaN alone, in the first and in the last (partial) vector of 16
        x = torch.randn(1, k, generator=gen)
        x[0, where] = float("nan")
        assert torch.isnan(torch.ops.neuronpack.linear_int8(x, w, scale)).all()


def test_int8_one_row_every_weight_row_count(dot_products):
    """The digit kernel takes four weight rows at a time (one stream or four) and the rest one by one: every count of
    weight rows and a row of x that ends inside a vector of 64 give the reference's result."""
    gen = torch.Generator().manual_seed(9)
    for n in (1, 3, 4, 5, 33, 130):
        w = torch.randint(-127, 128, (n, 577), dtype=torch.int8, generator=gen)
        scale = torch.rand(n, 1, generator=gen) / 50
        x = torch.randn(1, 577, generator=gen)
        ref = (x @ w.float().T) * scale.reshape(1, -1)
        magnitude = (x.abs() @ w.float().abs().T) * scale.reshape(1, -1)
        assert _relative_error(torch.ops.neuronpack.linear_int8(x, w, scale), ref, magnitude) < 1e-5


@pytest.mark.parametrize(("rows", "k"), [(8, 1536), (16, 1000), (6, 4099)])
def test_rows_longer_than_l1_holds_run_in_blocks(dot_products, rows, k):
    """Rows of x that do not all fit in L1 (rows * k > 6144 floats) are dotted a block of k at a time and summed:
    float32, bfloat16 (widening) and int8 weights give the reference's result, with and without bias."""
    gen = torch.Generator().manual_seed(rows + k)
    x = torch.randn(rows, k, generator=gen)
    w = torch.randn(67, k, generator=gen)
    b = torch.randn(67, generator=gen)
    for bias in (None, b):
        ref = F.linear(x, w, bias)
        magnitude = F.linear(x.abs(), w.abs(), None if bias is None else bias.abs())
        assert _relative_error(torch.ops.neuronpack.linear(x, w, bias), ref, magnitude) < 1e-5
        xb, wb = x.bfloat16(), w.bfloat16()
        ref = F.linear(xb.float(), wb.float(), None if bias is None else bias.bfloat16().float())
        y = torch.ops.neuronpack.linear(xb, wb, None if bias is None else bias.bfloat16())
        assert _relative_error(y, ref, magnitude) < 1e-2
    q = torch.randint(-127, 128, (67, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(67, 1, generator=gen) / 50
    ref = (x @ q.float().T) * scale.reshape(1, -1)
    magnitude = (x.abs() @ q.float().abs().T) * scale.reshape(1, -1)
    assert _int8_error_ok(torch.ops.neuronpack.linear_int8(x, q, scale), x, q, scale, magnitude, ref, dot_products)


def _mixed_magnitude_rows(rows: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """x [rows, k]: a row of huge values, a row of tiny ones, an outlier in the last row."""
    x = torch.randn(rows, k, generator=gen)
    x[0] *= 1e4
    x[1] *= 1e-6
    x[-1, k // 2] = 500.0
    return x


def _non_finite_rows_give_float_nans(rows: int, w: torch.Tensor, scale: torch.Tensor, gen: torch.Generator):
    """A NaN in row 2 and an inf in row 3 of ``rows`` rows make linear_int8 take its float path: NaN exactly where
    the float reference has it. Returns (x, y, reference)."""
    k = w.shape[1]
    x = torch.randn(rows, k, generator=gen)
    x[2, k - 1] = float("nan")
    x[3, 0] = float("inf")
    y = torch.ops.neuronpack.linear_int8(x, w, scale)
    ref = (x @ w.float().T) * scale.reshape(1, -1)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    return x, y, ref


@pytest.mark.parametrize("k", [1, 63, 576, 9000])
def test_int8_rows_round_x_to_int16_per_row(dot_products, k):
    """2-16 rows of x on AVX512_VNNI (int8_rows.cpp): each row rounded to int16 with a scale of its own, so a row of
    tiny values keeps its precision beside a row of huge ones, an outlier costs only its own row, every count of rows
    and of weight rows (pairs and an odd last one, over threads) is within that rounding, and a row holding an inf or
    a NaN makes the whole call take the float kernel (NaN where the float reference has it)."""
    gen = torch.Generator().manual_seed(k)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for rows in (2, 3, 8, 9, 16):
            for n in (1, 2, 7, 64):
                w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
                scale = torch.rand(n, 1, generator=gen) / 50
                x = _mixed_magnitude_rows(rows, k, gen)
                ref = (x.double() @ w.double().T * scale.double().reshape(1, -1)).float()
                magnitude = (x.abs() @ w.float().abs().T) * scale.reshape(1, -1)
                y = torch.ops.neuronpack.linear_int8(x, w, scale)
                assert _int8_error_ok(y, x, w, scale, magnitude, ref, dot_products)
                zero = torch.ops.neuronpack.linear_int8(torch.zeros(rows, k), w, scale)
                assert (zero == 0).all()
        x, y, ref = _non_finite_rows_give_float_nans(4, w, scale, gen)
        magnitude = (x[:2].abs() @ w.float().abs().T) * scale.reshape(1, -1)
        assert _relative_error(y[:2], ref[:2], magnitude) < 1e-5  # the float kernel: float32's rounding
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("k", [1, 63, 576, 1536])
def test_int8_many_rows_run_integer_gemms(k):
    """More than 16 float32 rows (a prefill) against int8 weights: torch's integer GEMM on two int8 rows per row of
    x (int8_gemm.cpp), each row to within max|x[m]| / 64516 per element whatever the other rows hold, per-tensor and
    per-channel scales, a bias, over threads; zeros give zeros; a row holding an inf or a NaN makes the call take the
    float path (NaN where the float reference has it)."""
    gen = torch.Generator().manual_seed(k)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for rows in (17, 41, 100):
            for n, per_tensor in ((1, False), (7, True), (64, False)):
                w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
                scale = torch.rand(1 if per_tensor else n, 1, generator=gen) / 50
                b = torch.randn(n, generator=gen)
                x = _mixed_magnitude_rows(rows, k, gen)
                ref = (x.double() @ w.double().T * scale.double().reshape(1, -1) + b.double()).float()
                magnitude = (x.abs() @ w.float().abs().T) * scale.reshape(1, -1) + b.abs()
                y = torch.ops.neuronpack.linear_int8(x, w, scale, b)
                assert y.shape == (rows, n) and y.dtype == torch.float32
                assert _int8_error_ok(y, x, w, scale, magnitude, ref, "dot products")
                assert (torch.ops.neuronpack.linear_int8(torch.zeros(rows, k), w, scale) == 0).all()
        _non_finite_rows_give_float_nans(20, w, scale, gen)
    finally:
        torch.set_num_threads(threads)


def test_int8_many_rows_keep_two_int8_digits_of_x():
    """The integer path is the one taken, and it keeps what two int8 digits of a row hold: x = [1, 1e-3, 1e-7]
    against w = [127, 127, 127] loses the 1e-7 (below 1 / 64516 of the row's largest value), float32 keeps it."""
    x = torch.tensor([[1.0, 1e-3, 1e-7]]).repeat(17, 1)
    w = torch.full((1, 3), 127, dtype=torch.int8)
    y = torch.ops.neuronpack.linear_int8(x, w, torch.ones(1, 1))
    torch.testing.assert_close(y, torch.full((17, 1), 127 * (1 + 1e-3)), rtol=1e-7, atol=0)
    few = torch.ops.neuronpack.linear_int8(x[:1], w, torch.ones(1, 1))  # one row: float32 (int8_row.cpp)
    torch.testing.assert_close(few, torch.full((1, 1), 127 * (1 + 1e-3 + 1e-7)), rtol=1e-7, atol=0)


def test_int8_many_rows_of_a_very_long_k_take_the_float_path():
    """Past 131072 products an int32 sum could overflow: the float path runs (float32's rounding)."""
    k = 131073
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(17, k, generator=gen)
    w = torch.full((2, k), 127, dtype=torch.int8)
    y = torch.ops.neuronpack.linear_int8(x, w, torch.ones(2, 1))
    ref = x.double() @ w.double().T
    assert _relative_error(y, ref.float(), x.abs() @ w.float().abs().T) < 1e-5


def test_leading_dims_threads_and_large_shapes():
    """[b, T, in] inputs, SmolLM2-sized weights, and two threads splitting the weight rows give F.linear's result; so
    do a prefill's rows (17-256: oneDNN's matmul, more: at::linear's), with a bias."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(1536, 576, generator=gen) * 0.02
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            for shape in ((1, 1, 576), (4, 1, 576), (2, 3, 576), (3, 20, 576), (1, 41, 576), (2, 150, 576)):
                x = torch.randn(*shape, generator=gen)
                torch.testing.assert_close(torch.ops.neuronpack.linear(x, w), F.linear(x, w), atol=1e-5, rtol=1e-4)
                b = torch.randn(1536, generator=gen)
                torch.testing.assert_close(torch.ops.neuronpack.linear(x, w, b), F.linear(x, w, b), atol=1e-5,
                                           rtol=1e-4)
    finally:
        torch.set_num_threads(threads)


def test_non_contiguous_input_and_mismatched_dtypes_fall_back():
    w = torch.randn(32, 64)
    for rows in (3, 40):  # the kernel's rows, a prefill's (oneDNN's matmul)
        x = torch.randn(64, rows).T  # [rows, 64], not contiguous
        torch.testing.assert_close(torch.ops.neuronpack.linear(x, w), F.linear(x, w), atol=1e-5, rtol=1e-4)
        q = torch.randint(-127, 128, (32, 64), dtype=torch.int8)
        ref = F.linear(x, q.float()) * 0.01
        torch.testing.assert_close(torch.ops.neuronpack.linear_int8(x, q, torch.full((32, 1), 0.01)), ref,
                                   atol=1e-3, rtol=1e-4)
    xb = torch.randn(2, 64).bfloat16()  # bfloat16 activations, float32 weight: at::linear decides (and refuses)
    with pytest.raises(RuntimeError):
        torch.ops.neuronpack.linear(xb, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_on_kernels_matches_transformers(make_checkpoint, dtype):
    path = make_checkpoint("llama", dtype=str(dtype).removeprefix("torch."))
    tokens = torch.randint(0, 384, (2, 24), generator=torch.Generator().manual_seed(1))
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
    model = load_model(path, dtype)
    with torch.no_grad():
        expected = ref(tokens).logits.float()
        plain = model.forward_full(tokens)
        use_kernels(model)
        assert all(m.kernel for m in model.modules() if isinstance(m, Linear))
        on_kernels = model.forward_full(tokens)
        step = model.forward_full(tokens[:, :1])  # 2 rows: the kernel itself, not the many-row fallback
    torch.testing.assert_close(on_kernels, plain, **TOLERANCE[dtype])
    torch.testing.assert_close(on_kernels, expected, **TOLERANCE[dtype])
    torch.testing.assert_close(step, expected[:, :1], **TOLERANCE[dtype])


def test_int8_model_on_kernels_matches_its_reference(make_checkpoint):
    """3 rows: float32's rounding on the widening kernel; with the int16 rows of x (int8_rows.cpp) each layer's
    inputs carry 2^-16 of their largest element more, which the logits show as ~1e-4 of their range; so do a
    prefill's 40 rows (int8_gemm.cpp)."""
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint

    path = make_checkpoint("llama")
    quantized = path.parent / "int8"
    quantize_checkpoint(path, quantized, QuantizeOptions("int8"))
    model = load_model(quantized, torch.float32)
    tokens = torch.randint(0, 384, (3, 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = model.forward_full(tokens)
        use_kernels(model)
        assert any(m.kernel for m in model.modules() if isinstance(m, Int8Linear))
        before = torch.ops.neuronpack.set_dot_products(False)
        try:
            torch.testing.assert_close(model.forward_full(tokens), reference, atol=1e-4, rtol=1e-4)
        finally:
            torch.ops.neuronpack.set_dot_products(before)
        int16 = model.forward_full(tokens)
        torch.testing.assert_close(int16, reference, atol=2e-3, rtol=1e-3)
        assert torch.equal(int16.argmax(-1), reference.argmax(-1))
        # a prefill of 40 tokens: int8_gemm.cpp's two int8 rows per row of x, the same precision
        prompt = torch.randint(0, 384, (1, 40), generator=torch.Generator().manual_seed(3))
        prefill = model.forward_full(prompt)
        for m in model.modules():
            m.kernel = False
        prefill_reference = model.forward_full(prompt)
        torch.testing.assert_close(prefill, prefill_reference, atol=2e-3, rtol=1e-3)
        assert torch.equal(prefill.argmax(-1), prefill_reference.argmax(-1))


def test_the_library_is_built_once_per_machine():
    """A built library is found again (same source, torch, compiler, CPU) and says whether it has the kernel."""
    assert _library_path().is_file()
    assert has_kernel() == torch.backends.cpu.get_cpu_capability().startswith("AVX512")
