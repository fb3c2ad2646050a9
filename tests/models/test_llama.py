"""The portable model against transformers: logits for every tiny family, fp32 and bf16, tied and untied; the
cache paths (context + decode) against the cache-free forward."""

from __future__ import annotations

import pytest
import torch
import transformers

from neuronpack.models import load_model
from tests.tiny_models import ARCHS

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
def test_context_then_decode_matches_full_forward(make_checkpoint, arch):
    """Prompt into slot 1 of a 2-slot cache (padded to 16), then two decode steps: same logits as no cache."""
    model = load_model(make_checkpoint(arch), torch.float32)
    cfg = model.config
    k = [torch.zeros(2, cfg.num_kv_heads, 33, cfg.head_dim) for _ in range(cfg.num_layers)]
    v = [torch.zeros_like(t) for t in k]
    seq = torch.randint(0, 384, (1, 12), generator=torch.Generator().manual_seed(2))
    full = model.forward_full(seq)[0]  # [12, vocab]
    with torch.no_grad():
        padded = torch.zeros(1, 16, dtype=torch.long)
        padded[0, :10] = seq[0, :10]
        first = model.forward_context(padded, torch.tensor([9]), torch.tensor([1]), k, v)
        torch.testing.assert_close(first[0], full[9], atol=1e-4, rtol=1e-4)
        for pos in (10, 11):
            # Slot 0 is idle (position 0, any token); slot 1 continues its sequence.
            out = model.forward_decode(torch.tensor([7, int(seq[0, pos])]), torch.tensor([0, pos]), k, v, 16)
            torch.testing.assert_close(out[1], full[pos], atol=1e-4, rtol=1e-4)
    assert k[0][0, :, 1:].abs().sum() == 0  # the idle slot wrote only its own position 0
