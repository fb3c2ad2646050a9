"""The EAGLE-1/2 draft model against a straightforward reference (transformers' own LlamaDecoderLayer, no cache), and
the EAGLE proposer's chain drafts against the same reference run step by step."""

from __future__ import annotations

import json

import pytest
import torch

from neuronpack.convert.eagle import convert_eagle
from neuronpack.errors import CheckpointError, UnsupportedModelError
from neuronpack.models.eagle import load_eagle_draft
from neuronpack.models.llama import store_kv
from neuronpack.runtime.speculation.eagle import EagleProposer
from neuronpack.runtime.speculation.proposer import DraftRequest
from tests.convert.eagle_fixtures import make_eagle1_draft, make_eagle3_draft


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tiny_llama):
    """A random EAGLE-1 draft in the original layout (fc.weight + bias, layers.0.* without input_layernorm, no
    lm_head, pytorch_model.bin) converted for the tiny Llama target."""
    vocab = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    base = tmp_path_factory.mktemp("eagle-draft")
    draft = make_eagle1_draft(base / "orig", vocab=vocab, layout="bin", dtype="float32", fc_bias=True)
    convert_eagle(draft, tiny_llama, base / "converted")
    return base / "converted"


def reference_logits(path, tokens: list[int], hidden: torch.Tensor) -> torch.Tensor:
    """EAGLE-1 from the checkpoint tensors with transformers' layer: fc(cat(embed, hidden)) -> LlamaDecoderLayer with
    an identity input norm -> the target's head; causal, positions 0..T-1. float32 [T, vocab]."""
    import transformers
    from safetensors.torch import load_file
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    w = {}
    for f in sorted(path.glob("*.safetensors")):
        w.update(load_file(f))
    config = transformers.LlamaConfig(**json.loads((path / "config.json").read_text()))
    config._attn_implementation = "eager"
    layer = LlamaDecoderLayer(config, 0)
    layer.load_state_dict({k[len("layers.0."):]: v for k, v in w.items() if k.startswith("layers.0.")},
                          strict=False)
    layer.input_layernorm = torch.nn.Identity()
    t = len(tokens)
    x = torch.cat((w["embed_tokens.weight"][tokens], hidden), dim=-1) @ w["fc.weight"].T + w["fc.bias"]
    positions = torch.arange(t)[None]
    cos_sin = LlamaRotaryEmbedding(config)(x[None], positions)
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        out = layer(x[None], attention_mask=mask, position_ids=positions, position_embeddings=cos_sin)
    out = out[0] if isinstance(out, tuple) else out
    return (out[0] @ w["lm_head.weight"].T).float()


def test_draft_logits_equal_the_reference_with_and_without_cache(converted):
    draft = load_eagle_draft(converted, torch.float32)
    assert isinstance(draft.layers[0].input_layernorm, torch.nn.Identity) and draft.fc.bias is not None
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, draft.config.vocab_size, (9,), generator=gen).tolist()
    hidden = torch.randn(9, draft.config.hidden_size, generator=gen)
    expected = reference_logits(converted, tokens, hidden)
    with torch.no_grad():
        full, _, _ = draft.forward_step(torch.tensor([tokens]), hidden[None], torch.tensor([0]), None, None, 0)
        torch.testing.assert_close(draft.logits(full[0]), expected, rtol=1e-4, atol=1e-4)
        # The same pairs in chunks of 4, 1 and 4 through the draft's own cache.
        cfg = draft.config
        k = torch.zeros(cfg.num_layers, 1, cfg.num_kv_heads, 16, cfg.head_dim)
        v = torch.zeros_like(k)
        outs = []
        for lo, hi in ((0, 4), (4, 5), (5, 9)):
            start = torch.tensor([lo])
            out, nk, nv = draft.forward_step(torch.tensor([tokens[lo:hi]]), hidden[None, lo:hi], start, list(k),
                                             list(v), lo)
            store_kv(k, torch.tensor([0]), start, nk)
            store_kv(v, torch.tensor([0]), start, nv)
            outs.append(out[0])
        torch.testing.assert_close(draft.logits(torch.cat(outs)), expected, rtol=1e-3, atol=1e-3)


def test_proposer_chain_drafts_equal_the_reference(converted):
    """After a prompt's hidden states and one verify step, the proposer's k drafts are the reference's greedy chain:
    each draft's pair is (previous draft, the draft's own output at the previous position)."""
    draft = load_eagle_draft(converted, torch.float32)
    gen = torch.Generator().manual_seed(1)
    h_dim, vocab = draft.config.hidden_size, draft.config.vocab_size
    prompt = torch.randint(0, vocab, (6,), generator=gen).tolist()
    prompt_hidden = torch.randn(6, h_dim, generator=gen)  # h_0..h_5
    proposer = EagleProposer(draft)
    proposer.prefilled(["r"], [prompt_hidden])
    ids = [*prompt, 17]  # x_6: the target's first token
    first = proposer.propose([DraftRequest("r", ids, max_tokens=3)])[0].token_ids
    # Verification kept the first draft: hidden states of positions 6 and 7 come back.
    verify_hidden = torch.randn(1, 4, h_dim, generator=gen)
    proposer.verified(["r"], [1], verify_hidden)
    ids = [*ids, first[0], 23]  # the kept draft and the target's token
    got = proposer.propose([DraftRequest("r", ids, max_tokens=4)])[0].token_ids

    def chain(pair_tokens, pair_hidden, k):
        """Greedy chain by re-running the whole sequence without a cache: the reference of ``propose``."""
        tokens, hidden, drafts = list(pair_tokens), pair_hidden, []
        for _ in range(k):
            with torch.no_grad():
                out, _, _ = draft.forward_step(torch.tensor([tokens]), hidden[None], torch.tensor([0]), None, None, 0)
            drafts.append(int(reference_logits(converted, tokens, hidden)[-1].argmax()))
            tokens.append(drafts[-1])
            hidden = torch.cat((hidden, out[0, -1:]))
        return drafts

    assert first == chain(ids[1:7], prompt_hidden, 3)
    assert got == chain(ids[1:9], torch.cat((prompt_hidden, verify_hidden[0, :2])), 4)


def test_draft_checkpoints_the_runtime_refuses(tmp_path, tiny_llama):
    vocab = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    raw = make_eagle1_draft(tmp_path / "raw", vocab=vocab, layout="safetensors", dtype="float32")
    with pytest.raises(CheckpointError, match="convert-eagle"):
        load_eagle_draft(raw, torch.float32)
    eagle3 = make_eagle3_draft(tmp_path / "e3", vocab=vocab, dtype="float32")
    with pytest.raises(UnsupportedModelError, match="EAGLE-3"):
        load_eagle_draft(eagle3, torch.float32)
