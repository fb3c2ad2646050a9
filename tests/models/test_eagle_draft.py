"""The EAGLE-1/2 and EAGLE-3 draft models against straightforward references (transformers' own LlamaDecoderLayer /
LlamaAttention, MLP and norms, no cache), the EAGLE proposer's chain drafts against the same references run step by
step, and the draft graphs (exported, weights as inputs) against the eager draft."""

from __future__ import annotations

import json

import pytest
import torch

from neuronpack.convert.eagle import convert_eagle
from neuronpack.errors import CheckpointError, UnsupportedModelError
from neuronpack.models.eagle import load_eagle_draft
from neuronpack.models.llama import store_kv
from neuronpack.runtime.engine.speculation.eagle import EagleProposer
from neuronpack.runtime.engine.speculation.proposer import DraftRequest
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


def run_uncached(draft, tokens: list[int], hidden: torch.Tensor) -> torch.Tensor:
    """The draft over pairs at positions 0..T-1 with nothing cached (one masked past position): z [T, H]."""
    cfg = draft.config
    empty = torch.zeros(cfg.num_layers, 1, cfg.num_kv_heads, 1, cfg.head_dim)
    z, _, _ = draft.forward_step(torch.tensor([tokens]), hidden[None], torch.tensor([0]), empty, empty, 1)
    return z[0]


def run_in_chunks(draft, tokens: list[int], hidden: torch.Tensor, chunks) -> torch.Tensor:
    """The same pairs fed chunk by chunk ((lo, hi) index ranges) through the draft's own cache: z [T, H]."""
    cfg = draft.config
    k = torch.zeros(cfg.num_layers, 1, cfg.num_kv_heads, 16, cfg.head_dim)
    v = torch.zeros_like(k)
    outs = []
    for lo, hi in chunks:
        start, n = torch.tensor([lo]), max(lo, 1)
        out, nk, nv = draft.forward_step(torch.tensor([tokens[lo:hi]]), hidden[None, lo:hi], start,
                                         k[:, :, :, :n], v[:, :, :, :n], n)
        store_kv(k, torch.tensor([0]), start, nk)
        store_kv(v, torch.tensor([0]), start, nv)
        outs.append(out[0])
    return torch.cat(outs)


def test_draft_logits_equal_the_reference_with_and_without_cache(converted):
    draft = load_eagle_draft(converted, torch.float32)
    assert isinstance(draft.layers[0].input_layernorm, torch.nn.Identity) and draft.fc.bias is not None
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, draft.config.vocab_size, (9,), generator=gen).tolist()
    hidden = torch.randn(9, draft.config.hidden_size, generator=gen)
    expected = reference_logits(converted, tokens, hidden)
    with torch.no_grad():
        full = run_uncached(draft, tokens, hidden)
        torch.testing.assert_close(draft.logits(full), expected, rtol=1e-4, atol=1e-4)
        # The same pairs in chunks of 4, 1 and 4 through the draft's own cache.
        chunked = run_in_chunks(draft, tokens, hidden, ((0, 4), (4, 5), (5, 9)))
        torch.testing.assert_close(draft.logits(chunked), expected, rtol=1e-3, atol=1e-3)


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
                out = run_uncached(draft, tokens, hidden)
            drafts.append(int(reference_logits(converted, tokens, hidden)[-1].argmax()))
            tokens.append(drafts[-1])
            hidden = torch.cat((hidden, out[-1:]))
        return drafts

    assert first == chain(ids[1:7], prompt_hidden, 3)
    assert got == chain(ids[1:9], torch.cat((prompt_hidden, verify_hidden[0, :2])), 4)


def test_draft_checkpoints_the_runtime_refuses(tmp_path, tiny_llama):
    vocab = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    raw = make_eagle1_draft(tmp_path / "raw", vocab=vocab, layout="safetensors", dtype="float32")
    with pytest.raises(CheckpointError, match="convert-eagle"):
        load_eagle_draft(raw, torch.float32)


# -- EAGLE-3 ---------------------------------------------------------------------------------------------------------
AUX = [0, 1, 2]  # the 3-layer target's layers whose inputs the draft reads (config eagle_aux_hidden_state_layer_ids)


@pytest.fixture(scope="module")
def converted3(tmp_path_factory):
    """A random EAGLE-3 draft in its original layout (midlayer.*, d2t / t2d, fc [H, 3H], own norm and head)
    converted for a 3-layer tiny Llama (midlayer.* -> layers.0.*, the target's embedding added)."""
    from tests.helpers.tiny_models import make_tiny_checkpoint

    base = tmp_path_factory.mktemp("eagle3-draft")
    target = make_tiny_checkpoint(base / "target", layers=3)
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    draft = make_eagle3_draft(base / "orig", vocab=vocab, dtype="float32", aux_layers=AUX)
    convert_eagle(draft, target, base / "converted")
    return base / "converted"


def reference3(path, tokens: list[int], aux: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-3 from the checkpoint tensors with transformers' attention, MLP and RMSNorm (vLLM llama_eagle3.py's
    formula): h = fc(aux); attention over cat(input_norm(embed), hidden_norm(h)) with q/k/v taking 2H; h as the
    residual; logits = lm_head(norm(z)). Causal, positions 0..T-1. -> (float32 logits [T, vocab], z [T, H])."""
    import transformers
    from safetensors.torch import load_file
    from transformers.models.llama.modeling_llama import (
        LlamaAttention,
        LlamaMLP,
        LlamaRMSNorm,
        LlamaRotaryEmbedding,
    )

    w = {}
    for f in sorted(path.glob("*.safetensors")):
        w.update(load_file(f))
    config = transformers.LlamaConfig(**json.loads((path / "config.json").read_text()))
    config._attn_implementation = "eager"
    h_dim = config.hidden_size
    attn = LlamaAttention(config, 0)
    for name in ("q_proj", "k_proj", "v_proj"):
        out_features = getattr(attn, name).out_features
        setattr(attn, name, torch.nn.Linear(2 * h_dim, out_features, bias=False))
    attn.load_state_dict({k[len("layers.0.self_attn."):]: v for k, v in w.items()
                          if k.startswith("layers.0.self_attn.")})
    mlp = LlamaMLP(config)
    mlp.load_state_dict({k[len("layers.0.mlp."):]: v for k, v in w.items() if k.startswith("layers.0.mlp.")})

    def norm(name):
        module = LlamaRMSNorm(h_dim, eps=config.rms_norm_eps)
        module.weight.data = w[name]
        return module

    t = len(tokens)
    with torch.no_grad():
        h = aux @ w["fc.weight"].T
        attn_in = torch.cat((norm("layers.0.input_layernorm.weight")(w["embed_tokens.weight"][tokens]),
                             norm("layers.0.hidden_norm.weight")(h)), dim=-1)
        positions = torch.arange(t)[None]
        cos_sin = LlamaRotaryEmbedding(config)(attn_in[None], positions)
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        out, _ = attn(attn_in[None], position_embeddings=cos_sin, attention_mask=mask)
        x = h + out[0]
        z = x + mlp(norm("layers.0.post_attention_layernorm.weight")(x))
        return (norm("norm.weight")(z) @ w["lm_head.weight"].T).float(), z


def test_eagle3_draft_equals_the_reference_with_and_without_cache(converted3):
    draft = load_eagle_draft(converted3, torch.float32, target_layers=3)
    assert draft.eagle3 and draft.target_layers == (0, 1, 2)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, draft.config.vocab_size, (9,), generator=gen).tolist()
    aux = torch.randn(9, 3 * draft.config.hidden_size, generator=gen)
    expected, expected_z = reference3(converted3, tokens, aux)
    with torch.no_grad():
        hidden = draft.from_target(aux)
        z = run_uncached(draft, tokens, hidden)
        torch.testing.assert_close(z, expected_z, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(draft.logits(z), expected, rtol=1e-4, atol=1e-4)
        chunked = run_in_chunks(draft, tokens, hidden, ((0, 5), (5, 6), (6, 9)))
        torch.testing.assert_close(draft.logits(chunked), expected, rtol=1e-3, atol=1e-3)


def test_eagle3_proposer_chain_feeds_the_drafts_own_prenorm_output_back(converted3):
    """The first draft reads fc(target layers' inputs); each further draft reads the previous draft's un-normed
    output z (vLLM's hidden_prenorm), never fc of it."""
    draft = load_eagle_draft(converted3, torch.float32, target_layers=3)
    gen = torch.Generator().manual_seed(2)
    vocab, h_dim = draft.config.vocab_size, draft.config.hidden_size
    prompt = torch.randint(0, vocab, (5,), generator=gen).tolist()
    aux = torch.randn(5, 3 * h_dim, generator=gen)
    proposer = EagleProposer(draft)
    assert proposer.hidden_layers == (0, 1, 2)
    proposer.prefilled(["r"], [aux])
    ids = [*prompt, 11]
    got = proposer.propose([DraftRequest("r", ids, max_tokens=3)])[0].token_ids
    tokens, hidden, want = ids[1:], draft.from_target(aux).detach(), []
    for _ in range(3):
        with torch.no_grad():
            z = run_uncached(draft, tokens, hidden)
        want.append(int(draft.logits(z[-1]).argmax()))
        tokens.append(want[-1])
        hidden = torch.cat((hidden, z[-1:]))
    assert got == want
    first_logits, _ = reference3(converted3, ids[1:], aux)
    assert got[0] == int(first_logits[-1].argmax())


def test_eagle3_target_layers():
    from neuronpack.models.eagle import target_layer_ids

    assert target_layer_ids({}, 30) == (2, 15, 27)  # vLLM's default for Llama: (2, L // 2, L - 3)
    assert target_layer_ids({"eagle_aux_hidden_state_layer_ids": [5, 1, 3]}, 30) == (1, 3, 5)  # layer order


def test_eagle3_checkpoints_the_runtime_refuses(tmp_path, converted3):
    original = make_eagle3_draft(tmp_path / "orig", vocab=load_eagle_draft(converted3, torch.float32,
                                                                           target_layers=3).config.vocab_size,
                                 dtype="float32", aux_layers=AUX)
    with pytest.raises(CheckpointError, match="convert-eagle"):
        load_eagle_draft(original, torch.float32, target_layers=3)
    with pytest.raises(UnsupportedModelError, match="layer count"):
        load_eagle_draft(converted3, torch.float32)
    with pytest.raises(UnsupportedModelError, match="eagle_aux_hidden_state_layer_ids"):
        load_eagle_draft(converted3, torch.float32, target_layers=2)  # layer 2 does not exist
    # without the config key on a 4-layer target, vLLM's default (2, 2, 1) names two distinct layers, not three:
    # the error says so (it used to say "reads target layers [1, 2] ... but the target has 4 layers")
    import json
    import shutil

    default = shutil.copytree(converted3, tmp_path / "default-layers")
    config = json.loads((default / "config.json").read_text())
    config.pop("eagle_aux_hidden_state_layer_ids", None)
    (default / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError) as raised:
        load_eagle_draft(default, torch.float32, target_layers=4)
    text = raised.value.one_line()
    assert "vLLM's default (2, L // 2, L - 3) for this 4-layer target gives 2 distinct: [1, 2]" in text
    assert "3 distinct layers of the target (0 to 3)" in text


# -- the draft graphs --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("layout", ["eagle1", "eagle3"])
def test_exported_draft_graphs_equal_the_eager_draft(layout, kernels, converted, converted3):
    """draft_step and draft_head exported with dynamic shapes (weights as inputs; kernels: the linears call
    neuronpack's kernels, as AOTInductor artifacts' graphs do) give the eager draft's outputs at sizes other than
    the traced ones."""
    from neuronpack.backends.torch_aot.draft_graphs import (
        CompiledDraft,
        draft_weights,
        export_draft_graph,
    )
    from neuronpack.backends.torch_aot.graphs import GraphLimits
    from neuronpack.backends.torch_aot.layout import DRAFT_GRAPHS
    path = converted if layout == "eagle1" else converted3
    draft = load_eagle_draft(path, torch.float32, target_layers=3)
    limits = GraphLimits(batch_size=4, max_tokens=8, max_seq=32)
    runners = {}
    for name in DRAFT_GRAPHS:
        module = export_draft_graph(draft, name, limits, kernels=kernels).module()
        runners[name] = lambda weights, *args, module=module: tuple(module(weights, *args))
    assert set(draft_weights(draft, "draft_head")) == ({"lm_head.weight", "norm.weight"} if draft.eagle3
                                                      else {"lm_head.weight"})
    compiled_draft = load_eagle_draft(path, torch.float32, target_layers=3)  # its linears flagged when kernels
    graphs = CompiledDraft(runners, compiled_draft, limits.max_tokens, kernels=kernels)
    assert compiled_draft.lm_head.kernel == kernels and not draft.lm_head.kernel
    cfg, gen = draft.config, torch.Generator().manual_seed(4)
    k = torch.randn(cfg.num_layers, 3, cfg.num_kv_heads, 7, cfg.head_dim, generator=gen)
    v = torch.randn_like(k)
    tokens = torch.randint(0, cfg.vocab_size, (3, 5), generator=gen)
    hidden = torch.randn(3, 5, cfg.hidden_size, generator=gen)
    starts = torch.tensor([7, 0, 3])
    with torch.no_grad():
        eager = draft.forward_step(tokens, hidden, starts, k, v, 7)
        compiled = compiled_draft.forward_step(tokens, hidden, starts, k, v, 7, run_core=graphs.core)
        # kernels: sums in another order than MKL, and the fixture's randn weights (values O(10), attention logits
        # far larger) amplify float32 rounding through the softmax
        tol = dict(rtol=2e-3, atol=2e-2) if kernels else dict(rtol=1e-4, atol=1e-4)
        for a, b in zip(eager, compiled, strict=True):
            torch.testing.assert_close(a, b, **tol)
        torch.testing.assert_close(graphs.logits(eager[0][:, -1]), draft.logits(eager[0][:, -1]), rtol=1e-4,
                                   atol=1e-3)
        long_tokens = torch.randint(0, cfg.vocab_size, (1, 9), generator=gen)  # > max_tokens: the eager module
        long_hidden = torch.randn(1, 9, cfg.hidden_size, generator=gen)
        args = (long_tokens, long_hidden, torch.tensor([0]), k[:, :1, :, :1], v[:, :1, :, :1], 1)
        torch.testing.assert_close(compiled_draft.forward_step(*args, run_core=graphs.core)[0],
                                   draft.forward_step(*args)[0], **(tol if kernels else dict(rtol=1e-4, atol=1e-3)))
