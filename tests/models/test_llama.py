"""The portable model against transformers: logits for every tiny family, fp32 and bf16, tied and untied; the
cache paths (context + decode) against the cache-free forward."""

from __future__ import annotations

import pytest
import torch
import transformers

from neuronpack.models import load_model
from neuronpack.models.llama import store_kv
from tests.helpers.tiny_models import ARCHS

# (arch, tie): every family with its default tying, plus the opposite tying for llama and smollm.
CASES = [(arch, None) for arch in ARCHS] + [("llama", True), ("smollm", False)]
TOLERANCE = {"float32": dict(atol=1e-4, rtol=1e-4), "bfloat16": dict(atol=5e-2, rtol=2e-2)}


def hf_logits(path, dtype, tokens):
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
    with torch.no_grad():
        return ref(tokens).logits.float(), ref.config


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("arch", "tie"), CASES)
def test_logits_match_transformers(make_checkpoint, arch, tie, dtype):
    path = make_checkpoint(arch, tie=tie, dtype=dtype)
    tokens = torch.randint(0, 384, (2, 24), generator=torch.Generator().manual_seed(1))
    expected, hf_config = hf_logits(path, getattr(torch, dtype), tokens)
    model = load_model(path, getattr(torch, dtype))
    assert model.config.tie_word_embeddings == hf_config.tie_word_embeddings
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    with torch.no_grad():
        got = model.forward_full(tokens)
    assert got.dtype == torch.float32 and got.shape == (2, 24, 384)
    torch.testing.assert_close(got, expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_steps_match_full_forward(make_checkpoint, arch):
    """A prompt prefilled into row 1 of a 2-row cache (right padded), two decode steps, then a 3-token verify step:
    the same logits as the cache-free forward; the idle row's cache is never touched."""
    model = load_model(make_checkpoint(arch), torch.float32)
    cfg = model.config
    k = torch.zeros(cfg.num_layers, 2, cfg.num_kv_heads, 33, cfg.head_dim)
    v = torch.zeros_like(k)
    seq = torch.randint(0, 384, (1, 15), generator=torch.Generator().manual_seed(2))
    full = model.forward_full(seq)[0]  # [15, vocab]

    def step(rows, tokens, starts, n_past, logit_index):
        rows, starts = torch.tensor(rows), torch.tensor(starts)
        logits, hidden, nk, nv = model.forward_step(torch.tensor(tokens), starts, n_past, k[:, rows], v[:, rows],
                                                    torch.tensor(logit_index))
        store_kv(k, rows, starts, nk)
        store_kv(v, rows, starts, nv)
        return logits, hidden

    with torch.no_grad():
        padded = [[*seq[0, :10].tolist(), 0, 0, 0, 0, 0, 0]]
        first, hidden = step([1], padded, [0], 1, [[9]])
        torch.testing.assert_close(first[0, 0], full[9], atol=1e-4, rtol=1e-4)
        assert hidden.shape == (1, 16, cfg.hidden_size)
        for pos in (10, 11):
            out, _ = step([1], [[int(seq[0, pos])]], [pos], 16, [[0]])
            torch.testing.assert_close(out[0, 0], full[pos], atol=1e-4, rtol=1e-4)
        out, _ = step([1], [seq[0, 12:15].tolist()], [12], 16, [[0, 1, 2]])  # verify three tokens at once
        torch.testing.assert_close(out[0], full[12:15], atol=1e-4, rtol=1e-4)
    assert k[:, 0].abs().sum() == 0 and v[:, 0].abs().sum() == 0  # the idle row was never written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_position_tables_change_no_value(make_checkpoint, dtype):
    """``use_position_tables`` (what a runtime turns on) looks up the rotary rows and key positions a step computes
    otherwise: prefill, decode and verify steps give bit-identical logits, hidden states and new K/V."""
    path = make_checkpoint("llama3", dtype="bfloat16" if dtype == torch.bfloat16 else "float32")
    plain, tabled = load_model(path, dtype), load_model(path, dtype)
    tabled.use_position_tables(40)
    cfg = plain.config
    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(cfg.num_layers, 2, cfg.num_kv_heads, 40, cfg.head_dim, generator=gen)
    tokens = torch.randint(0, 384, (2, 3), generator=gen)
    with torch.no_grad():
        for rows, starts, n_past in ((tokens, [0, 0], 1), (tokens[:, :1], [7, 31], 31), (tokens, [20, 5], 20)):
            args = (rows, torch.tensor(starts), n_past, cache.to(dtype), cache.to(dtype),
                    torch.zeros(2, 1, dtype=torch.long))
            for a, b in zip(plain.forward_step(*args), tabled.forward_step(*args), strict=True):
                assert torch.equal(a, b)
