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


def formula(q, k, v, k_past, v_past, past, scale):
    """The attention of a decode step in torch ops, rounding as Attention does (oracle for the kernel)."""
    dtype = q.dtype

    def scores(keys):
        return (q.float() @ keys.float().transpose(-1, -2)).to(dtype).mul(scale).float()

    s = torch.cat((scores(k_past).masked_fill(~past, float("-inf")), scores(k)), dim=-1)
    p = torch.softmax(s, dim=-1).to(dtype)
    n = k_past.shape[2]
    return (p[..., :n].float() @ v_past.float()).to(dtype) + (p[..., n:].float() @ v.float()).to(dtype)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 9), kv=st.integers(1, 3), group=st.integers(1, 4), head_dim=st.sampled_from([8, 16, 20, 64]),
       cached=st.integers(1, 40), spare=st.integers(0, 9), keep=st.floats(0.0, 1.0),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_kernel_matches_the_formula(rows, kv, group, head_dim, cached, spare, keep, dtype):
    gen = torch.Generator().manual_seed(rows * 1000 + cached * 10 + head_dim + group)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    q, k, v = rand(rows, kv, group, head_dim), rand(rows, kv, 1, head_dim), rand(rows, kv, 1, head_dim)
    # the cache rows are a slice of a longer cache, as the graph passes them
    k_cache, v_cache = rand(rows, kv, cached + spare, head_dim), rand(rows, kv, cached + spare, head_dim)
    past = torch.rand(rows, 1, 1, cached, generator=gen) < keep
    args = (q, k, v, k_cache[:, :, :cached], v_cache[:, :, :cached], past, 1 / math.sqrt(head_dim))
    out = torch.ops.neuronpack.decode_attention(*args)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out, formula(*args), **EXACT[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cached", [64, 129, 700])
def test_long_caches_match_the_formula(dtype, cached):
    """Caches longer than the kernel's prefetch distance (keys and values are prefetched ahead of the block being
    read, and the next row's first positions meanwhile): the same result as the formula."""
    gen = torch.Generator().manual_seed(cached)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    rows, kv, group, head_dim = 3, 2, 3, 128
    k_cache, v_cache = rand(rows, kv, cached + 5, head_dim), rand(rows, kv, cached + 5, head_dim)
    past = torch.rand(rows, 1, 1, cached, generator=gen) < 0.9
    args = (rand(rows, kv, group, head_dim), rand(rows, kv, 1, head_dim), rand(rows, kv, 1, head_dim),
            k_cache[:, :, :cached], v_cache[:, :, :cached], past, 1 / math.sqrt(head_dim))
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
