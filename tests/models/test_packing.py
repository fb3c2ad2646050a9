"""oneDNN-packed linear weights: a packed model computes what the plain one does, against transformers too; only the
float linears are packed, one copy each (the tied LM head gets its own, the embedding stays plain)."""

from __future__ import annotations

import pytest
import torch
import transformers

from neuronpack.models import load_model
from neuronpack.models.llama import Linear
from neuronpack.models.packing import can_pack, linear_weight_names, pack_linears, packed_weights
from neuronpack.models.quant import Int8Linear

pytestmark = pytest.mark.skipif(not can_pack(torch.float32), reason="this torch has no oneDNN")
TOLERANCE = {"float32": dict(atol=1e-4, rtol=1e-4), "bfloat16": dict(atol=5e-2, rtol=2e-2)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packed_model_matches_transformers(make_checkpoint, dtype):
    if not can_pack(getattr(torch, dtype)):
        pytest.skip(f"oneDNN does not run packed {dtype} here")
    path = make_checkpoint("llama", dtype=dtype)
    tokens = torch.randint(0, 384, (2, 24), generator=torch.Generator().manual_seed(1))
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype),
                                                            attn_implementation="eager").eval()
    model = load_model(path, getattr(torch, dtype))
    with torch.no_grad():
        expected = ref(tokens).logits.float()
        plain = model.forward_full(tokens)
        pack_linears(model)
        packed = model.forward_full(tokens)
    torch.testing.assert_close(packed, plain, **TOLERANCE[dtype])
    torch.testing.assert_close(packed, expected, **TOLERANCE[dtype])


def test_only_float_linears_are_packed_once(make_checkpoint):
    model = load_model(make_checkpoint("llama"), torch.float32)  # tied embeddings
    embedding = model.model.embed_tokens.weight
    pack_linears(model)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(m.packed and m.weight.is_mkldnn for m in linears)
    assert model.lm_head.weight is not embedding and not embedding.is_mkldnn  # the embedding stays plain
    assert not model.model.norm.weight.is_mkldnn
    first = model.model.layers[0].self_attn.q_proj.weight
    pack_linears(model)  # packing twice changes nothing
    assert model.model.layers[0].self_attn.q_proj.weight is first


def test_packed_weights_keep_names_and_order_and_mark_the_module():
    layer = torch.nn.Module()
    layer.proj = Linear(8, 4)
    layer.quant = Int8Linear(8, 4)
    layer.norm = torch.nn.Parameter(torch.ones(8))
    torch.nn.init.normal_(layer.proj.weight)
    weights = {**dict(layer.named_parameters()), **dict(layer.named_buffers())}
    packed = packed_weights(layer, weights)
    assert list(packed) == list(weights)
    assert linear_weight_names(layer) == {"proj.weight"}
    assert packed["proj.weight"].is_mkldnn and layer.proj.packed
    assert packed["quant.weight"] is weights["quant.weight"] and packed["norm"] is weights["norm"]
    x = torch.randn(3, 8)
    torch.testing.assert_close(torch.func.functional_call(layer.proj, {"weight": packed["proj.weight"]}, (x,)),
                               torch.nn.functional.linear(x, weights["proj.weight"]))
