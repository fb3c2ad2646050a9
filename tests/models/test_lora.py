"""Per-row LoRA arithmetic against PEFT's merged weights (merge_and_unload), one linear at a time."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neuronpack.checkpoint.lora import read_adapter
from neuronpack.errors import CheckpointError
from neuronpack.models.loading import load_model
from neuronpack.models.lora import LoraLayout, attach_lora, fill_lora, lora_linears, lora_mask, project
from tests.helpers.lora_adapters import ATTENTION, make_peft_adapter, merged_reference

LAYOUT = LoraLayout(max_loras=3, max_rank=16, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "up_proj"))


@pytest.fixture(scope="module")
def adapters(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return [make_peft_adapter(tiny_llama, root / "a", rank=8, alpha=16, seed=1),
            make_peft_adapter(tiny_llama, root / "b", rank=4, alpha=4, seed=2, use_rslora=True,
                              target_modules=("v_proj", "up_proj"))]


def test_each_row_gets_its_own_adapter_and_slot_zero_is_the_base_model(tiny_llama, adapters):
    model = load_model(tiny_llama, torch.float32)
    attach_lora(model, LAYOUT)
    infos = [read_adapter(p.name, p, target_modules=LAYOUT.target_modules, max_rank=16) for p in adapters]
    fill_lora(model, LAYOUT, infos)
    refs = [merged_reference(tiny_llama, None)] + [merged_reference(tiny_llama, p) for p in adapters]
    x = torch.randn(4, 3, 64, generator=torch.Generator().manual_seed(0))
    rows = torch.tensor([0, 1, 2, 3])  # base, a, b, an empty slot (= base)
    mask = lora_mask(rows, LAYOUT, torch.float32)
    for index, module, linear in lora_linears(model, LAYOUT):
        got = project(linear, x, mask)
        for row, ref_index in enumerate((0, 1, 2, 0)):
            block = "mlp" if module == "up_proj" else "self_attn"
            weight = getattr(getattr(refs[ref_index].model.layers[index], block), module).weight
            torch.testing.assert_close(got[row], F.linear(x[row], weight), rtol=1e-5, atol=1e-5)


def test_more_adapters_than_slots_and_foreign_shapes_are_refused(tiny_llama, adapters, make_checkpoint, tmp_path):
    model = load_model(tiny_llama, torch.float32)
    small = LoraLayout(max_loras=1, max_rank=16, target_modules=ATTENTION + ("up_proj",))
    attach_lora(model, small)
    infos = [read_adapter(p.name, p, target_modules=small.target_modules, max_rank=16) for p in adapters]
    with pytest.raises(CheckpointError, match="2 adapters for 1 slots"):
        fill_lora(model, small, infos)
    other = make_checkpoint("smollm")  # hidden 48: the adapter's matrices do not fit
    foreign = load_model(other, torch.float32)
    attach_lora(foreign, small)
    with pytest.raises(CheckpointError, match="do not fit this model"):
        fill_lora(foreign, small, infos[:1])
