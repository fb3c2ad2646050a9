"""Per-row LoRA in a compiled artifact: every adapter's greedy output equals transformers + PEFT with the adapter
merged (merge_and_unload), token for token, in batches that mix adapters and the base model."""

from __future__ import annotations

import json

import pytest
import torch

from neuronpack.artifacts.manifest import read_manifest
from neuronpack.backends.torch_aot import load_artifact
from neuronpack.pipeline import verify_artifact
from tests.helpers.lora_adapters import greedy_reference, merged_reference

pytestmark = pytest.mark.slow
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def lm(lora_artifact):
    return load_artifact(lora_artifact[0])


@pytest.fixture(scope="module")
def references(lora_artifact, tiny_llama):
    """adapter slot -> the transformers model with that adapter merged (slot 0: the base model)."""
    adapters = lora_artifact[1]
    return {0: merged_reference(tiny_llama, None), 1: merged_reference(tiny_llama, adapters["sql"]),
            2: merged_reference(tiny_llama, adapters["chat"])}


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 384, (n,), generator=gen).tolist() for n in lengths]


def greedy(lm, slots, prompts, adapters, new_tokens=NEW_TOKENS):
    """Prefill every prompt into its slot at once, then decode them together, each row with its adapter."""
    tokens = lm.prefill(slots, prompts, adapters=adapters).argmax(-1)
    positions = torch.tensor([len(p) for p in prompts])
    out = [[int(t)] for t in tokens]
    for _ in range(new_tokens - 1):
        tokens = lm.decode(tokens, positions, slots=slots, adapters=adapters).argmax(-1)
        positions += 1
        for row, token in enumerate(tokens.tolist()):
            out[row].append(token)
    return out


def test_the_artifact_carries_its_adapters_and_says_so(lora_artifact, lm):
    art, adapters = lora_artifact
    for name in adapters:
        assert (art / "lora" / name / "adapter_config.json").is_file()
        assert (art / "lora" / name / "adapter_model.safetensors").read_bytes() == \
            (adapters[name] / "adapter_model.safetensors").read_bytes()
    config = json.loads((art / "neuron_config.json").read_text())["lora"]
    assert [a["name"] for a in config["adapters"]] == ["sql", "chat"] and config["max_rank"] == 8
    manifest = read_manifest(art)
    assert [m.name for m in manifest.serve.lora_modules] == ["sql", "chat"]
    assert lm.adapter_names == ("sql", "chat")
    verify_artifact(art)


def test_a_batch_mixing_two_adapters_and_the_base_model_equals_peft_merged(lm, references):
    prompts = _prompts((5, 17, 9))
    slots, adapters = [2, 0, 1], [1, 2, 0]  # slots out of order: the runtime packs rows, adapters must follow
    got = greedy(lm, slots, prompts, adapters)
    for row, adapter in enumerate(adapters):
        assert got[row] == greedy_reference(references[adapter], prompts[row], NEW_TOKENS), f"adapter {adapter}"
    assert got[0] != greedy_reference(references[0], prompts[0], NEW_TOKENS)  # the adapter changed the tokens


def test_same_prompt_three_ways_and_no_adapters_argument_means_base(lm, references):
    prompt = _prompts((11,), seed=3)[0]
    got = greedy(lm, [0, 1, 2], [prompt] * 3, [0, 1, 2])
    assert len({tuple(g) for g in got}) == 3  # each adapter leads somewhere else
    assert greedy(lm, [1], [prompt], None) == [greedy_reference(references[0], prompt, NEW_TOKENS)]
    with pytest.raises(ValueError, match="adapter"):
        lm.decode(torch.tensor([1]), torch.tensor([3]), slots=[0], adapters=[3])  # only 2 adapters


def test_verify_scores_several_tokens_with_each_rows_adapter(lm, references):
    prompt = _prompts((12,), seed=5)[0]
    head, tail = prompt[:8], prompt[8:]
    lm.prefill([0, 1], [head, head], adapters=[1, 2])
    logits = lm.verify([0, 1], [tail, tail], [8, 8], adapters=[1, 2])  # [2, 4, vocab]
    for row, adapter in enumerate((1, 2)):
        with torch.no_grad():
            expected = references[adapter](torch.tensor([prompt])).logits[0, 8:].float()
        torch.testing.assert_close(logits[row], expected, rtol=1e-4, atol=1e-4)
