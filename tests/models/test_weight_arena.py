"""move_to_arena: a model's weights move into one huge-page arena with their values, names and ties; the model
computes exactly what it did."""

from __future__ import annotations

import torch

from neuronpack.models import load_model
from neuronpack.models.weight_arena import HUGE_PAGE, arena_copies, huge_page_arena, move_to_arena


def test_model_moves_with_values_and_ties_kept(make_checkpoint):
    model = load_model(make_checkpoint("smollm"), torch.float32)  # tied embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    before = {name: t.clone() for name, t in model.state_dict().items()}
    tokens = torch.randint(0, 384, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model.forward_full(tokens)
        move_to_arena(model)
        after = model.forward_full(tokens)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still one tensor
    state = model.state_dict()
    assert state.keys() == before.keys()
    for name, t in state.items():
        assert torch.equal(t, before[name]) and t.is_contiguous() and t.data_ptr() % 64 == 0, name
    ptrs = sorted((t.data_ptr(), t.numel() * t.element_size()) for t in {t.data_ptr(): t for t in state.values()}
                  .values())
    assert all(a + n <= b for (a, n), (b, _) in zip(ptrs, ptrs[1:], strict=False))  # no overlap
    assert ptrs[-1][0] + ptrs[-1][1] - ptrs[0][0] < sum(n for _, n in ptrs) + 64 * len(ptrs)  # one arena
    assert torch.equal(after, expected)
    assert not any(p.requires_grad for p in model.parameters())


def test_int8_buffers_move_too(make_checkpoint):
    from neuronpack.convert.quantize import QuantizeOptions, quantize_checkpoint

    path = make_checkpoint("llama")
    quantize_checkpoint(path, path.parent / "int8", QuantizeOptions("int8"))
    model = load_model(path.parent / "int8", torch.float32)
    layer = model.model.layers[0].self_attn.q_proj
    weight, scale = layer.weight.clone(), layer.scale.clone()
    move_to_arena(model)
    assert layer.weight.dtype == torch.int8 and torch.equal(layer.weight, weight)
    assert torch.equal(layer.scale, scale)


def test_arena_is_aligned_to_a_huge_page():
    arena = huge_page_arena(3 * HUGE_PAGE + 5)
    assert arena.numel() == 3 * HUGE_PAGE + 5 and arena.data_ptr() % HUGE_PAGE == 0
    assert int(arena.sum()) == 0
    a, b = arena_copies([torch.arange(5, dtype=torch.int16), torch.ones(2, 3)])
    assert torch.equal(a, torch.arange(5, dtype=torch.int16)) and torch.equal(b, torch.ones(2, 3))
    assert b.data_ptr() - a.data_ptr() == 64
