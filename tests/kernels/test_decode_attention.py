"""neuronpack's decode attention (neuronpack/kernels/attention.cpp): torch.ops.neuronpack.decode_attention gives what
the model's Attention computes in torch ops for one token per row against a cache, for float32 and bfloat16, any
row count, cached length, head size, mask and cache stride; a flagged Attention uses it for decode steps only."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuronpack.kernels import load_kernels
from neuronpack.models import load_model
from neuronpack.models.linear_kernels import use_kernels
from neuronpack.models.llama import Attention, StepMasks, causal_mask, rope_cos_sin


@pytest.fixture(autouse=True, scope="module")
def kernels():
    load_kernels()


EXACT = {torch.float32: dict(atol=2e-6, rtol=1e-5), torch.bfloat16: dict(atol=0, rtol=0)}


def probabilities(q, k, k_past, past, scale):
    """The softmax over [cached keys, own key] rounded to the dtype, as Attention computes it: [B, kv, g, L + 1]."""
    dtype = q.dtype

    def scores(keys):
        return (q.float() @ keys.float().transpose(-1, -2)).to(dtype).mul(scale).float()

    s = torch.cat((scores(k_past).masked_fill(~past, float("-inf")), scores(k)), dim=-1)
    return torch.softmax(s, dim=-1).to(dtype)


def formula(q, k, v, k_past, v_past, past, scale):
    """The attention of a decode step in torch ops, rounding as Attention does (oracle for the kernel)."""
    p = probabilities(q, k, k_past, past, scale)
    n = k_past.shape[2]
    return (p[..., :n].float() @ v_past.float()).to(q.dtype) + (p[..., n:].float() @ v.float()).to(q.dtype)


# Below this probability a cached position's value row is zeroed in bfloat16 cases (``decode_case``).
SMALLEST_WEIGHT = 2.0**-14


def decode_case(gen, rows, kv, group, head_dim, cached, spare, keep, dtype):
    """decode_attention's arguments: random queries, keys and values; the cache rows a slice of a longer cache, as the
    graph passes them; ``keep`` of the cached positions allowed.

    In bfloat16 every float32 sum the formula and the kernel compute is exact, so that its order does not matter.
    The two compute each rounding step alike (the scores' rounding to the dtype and their scaling in it; the softmax
    in float32 as ATen's: exp, sum and the sum's reciprocal; the probabilities rounded to the dtype; the cached and
    own parts rounded to it, then added) except the order of two float32 sums: the scores (q . k over head_dim) and
    the cached part (p . v over the positions). The kernel's is 16 lanes of FMAs and a shuffle tree; the formula's
    is torch's matmul, whose order depends on the shape and on the code MKL picks for the CPU (and Attention's own
    decode path sums with torch.sum, in a third order). Two orders of an inexact float32 sum, rounded to bfloat16,
    now and then fall on either side of a rounding boundary: one score or one part a bfloat16 ulp apart, which the
    softmax and the weighted sum spread over a head's outputs (with normal random values: ~0.1-0.15% of the
    bfloat16 cases, up to ~50 ulps of the larger part). No order of the kernel's matches every order of torch's,
    and a tolerance wide enough for that would also pass a softmax that rounds differently from ATen's (the kernel
    once divided by the sum: that moved one probability in six by a float32 ulp and failed ~0.3% of the bfloat16
    cases). So the values are drawn where every order gives the same float32 sums, and compared bit for bit:

    - q and k are multiples of 1/32 within +-4 (normal values, rounded and clipped): each q . k term is a multiple
      of 2^-10 of magnitude at most 16, and a score's partial sums (head_dim <= 128) stay under 2^11 = 2^21 units;
    - v is a multiple of 1/2 within +-3.5, and a probability p >= 2^-14 has a quantum of at least 2^-21 (8 bits):
      each p . v term is a multiple of 2^-22, and the cached part's partial sums stay under 3.5 * 1.003 (the rounded
      probabilities' sum, at most) < 2^2 = 2^24 units. A cached position whose probability is under 2^-14
      (``SMALLEST_WEIGHT``) for one of its KV head's queries has its value row zeroed, which makes its term 0: that
      probability still counts in the softmax, where it is computed.

    float32 products are not exact (24-bit probabilities): float32 cases keep normal values and the tolerance.
    """
    exact = dtype == torch.bfloat16

    def rand(*shape, step=1 / 32, bound=4.0):
        x = torch.randn(*shape, generator=gen)
        return (x.div(step).round().clamp(-bound / step, bound / step) * step if exact else x).to(dtype)

    values = dict(step=0.5, bound=3.5)
    q, k, v = rand(rows, kv, group, head_dim), rand(rows, kv, 1, head_dim), rand(rows, kv, 1, head_dim, **values)
    k_cache, v_cache = rand(rows, kv, cached + spare, head_dim), rand(rows, kv, cached + spare, head_dim, **values)
    past = torch.rand(rows, 1, 1, cached, generator=gen) < keep
    args = (q, k, v, k_cache[:, :, :cached], v_cache[:, :, :cached], past, 1 / math.sqrt(head_dim))
    if exact:
        p = probabilities(q, k, args[3], past, args[6])[..., :cached]
        args[4][((p > 0) & (p < SMALLEST_WEIGHT)).any(dim=2)] = 0  # through the slice, into the cache
    return args


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 9), kv=st.integers(1, 3), group=st.integers(1, 4), head_dim=st.sampled_from([8, 16, 20, 64]),
       cached=st.integers(1, 40), spare=st.integers(0, 9), keep=st.floats(0.0, 1.0),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_kernel_matches_the_formula(rows, kv, group, head_dim, cached, spare, keep, dtype):
    """Bit for bit in bfloat16, on values whose float32 sums do not depend on their order (``decode_case``)."""
    gen = torch.Generator().manual_seed(rows * 1000 + cached * 10 + head_dim + group)
    args = decode_case(gen, rows, kv, group, head_dim, cached, spare, keep, dtype)
    out = torch.ops.neuronpack.decode_attention(*args)
    assert out.dtype == dtype and out.shape == args[0].shape
    torch.testing.assert_close(out, formula(*args), **EXACT[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cached", [64, 129, 700])
def test_long_caches_match_the_formula(dtype, cached):
    """Caches longer than the kernel's prefetch distance (keys and values are prefetched ahead of the block being
    read, and the next row's first positions meanwhile): the same result as the formula."""
    gen = torch.Generator().manual_seed(cached)
    args = decode_case(gen, rows=3, kv=2, group=3, head_dim=128, cached=cached, spare=5, keep=0.9, dtype=dtype)
    torch.testing.assert_close(torch.ops.neuronpack.decode_attention(*args), formula(*args), **EXACT[dtype])


def test_every_position_masked_leaves_the_token_itself():
    """With no cached position allowed, each query attends only to its own key: the output is its value."""
    q, k, v = torch.randn(2, 1, 3, 16), torch.randn(2, 1, 1, 16), torch.randn(2, 1, 1, 16)
    cache = torch.randn(2, 1, 5, 16)
    out = torch.ops.neuronpack.decode_attention(q, k, v, cache, cache, torch.zeros(2, 1, 1, 5, dtype=torch.bool), 0.25)
    torch.testing.assert_close(out, v.expand(2, 1, 3, 16))


def test_other_dtypes_run_the_formula():
    """float16 (no kernel path) gives the formula's result through torch ops."""
    args = [torch.randn(1, 2, 2, 8).half(), torch.randn(1, 2, 1, 8).half(), torch.randn(1, 2, 1, 8).half(),
            torch.randn(1, 2, 6, 8).half(), torch.randn(1, 2, 6, 8).half(), torch.ones(1, 1, 1, 6, dtype=torch.bool),
            0.3]
    torch.testing.assert_close(torch.ops.neuronpack.decode_attention(*args), formula(*args), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flagged_attention_runs_the_kernel_for_decode_steps(make_checkpoint, arch, dtype):
    """Attention with ``kernel`` set gives the same decode step as without (a real model's heads, RoPE, masks and a
    sliced cache), and a step of several tokens is unchanged (torch ops)."""
    model = load_model(make_checkpoint(arch, dtype=str(dtype).removeprefix("torch.")), dtype)
    attn = model.model.layers[0].self_attn
    use_kernels(attn)  # the projections too: below only the attention differs between the two runs
    assert isinstance(attn, Attention) and attn.kernel
    cfg = model.config
    rows, cached, seq = 3, 11, 16
    gen = torch.Generator().manual_seed(3)
    k_cache = torch.randn(rows, cfg.num_kv_heads, seq, cfg.head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(rows, cfg.num_kv_heads, seq, cfg.head_dim, generator=gen).to(dtype)
    starts = torch.tensor([11, 4, 7])
    for tokens in (1, 3):
        x = torch.randn(rows, tokens, cfg.hidden_size, generator=gen).to(dtype)
        positions = starts.view(rows, 1) + torch.arange(tokens)
        cos, sin = rope_cos_sin(model.rope_inv_freq, positions, dtype)
        masks = StepMasks(past=(torch.arange(cached)[None, :] < starts.view(rows, 1))[:, None, None, :],
                          new=causal_mask(tokens, cfg.queries_per_kv))
        with torch.no_grad():
            attn.kernel = False
            expected = attn(x, cos, sin, masks, k_cache, v_cache)
            attn.kernel = True
            got = attn(x, cos, sin, masks, k_cache, v_cache)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, **({"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else
                                               {"atol": 1e-2, "rtol": 1e-2}))
