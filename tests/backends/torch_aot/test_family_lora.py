"""Per-row LoRA on Gemma 3 in a compiled artifact (export-only graphs: the LoRA layer graphs of both attention
kinds, the sliding ones over rings): an adapter's greedy output and the base model's, side by side in one batch,
equal transformers + PEFT with the adapter merged, past the window."""

from __future__ import annotations

import pytest

from neuronpack.backends.torch_aot import load_artifact
from tests.backends.torch_aot.test_lora import _prompts, greedy
from tests.helpers.lora_adapters import greedy_reference, make_peft_adapter, merged_reference
from tests.runtime.serving import build_artifact

pytestmark = pytest.mark.slow


def test_gemma3_lora_rows_match_peft(make_checkpoint, tmp_path):
    checkpoint = make_checkpoint("gemma3")
    adapter = make_peft_adapter(checkpoint, tmp_path / "adapter", rank=8, alpha=16, seed=3,
                                target_modules=("q_proj", "v_proj", "o_proj", "up_proj"))
    art = build_artifact(checkpoint, tmp_path / "root", [
        "compiler=export", f'lora.adapters=[{{name="a", path="{adapter}"}}]', "lora.max_rank=8", "lora.max_loras=1",
        'lora.target_modules=["q_proj", "v_proj", "o_proj", "up_proj"]'])
    lm = load_artifact(art)
    prompts = _prompts((20, 13), seed=4)  # longer than the window of 8
    got = greedy(lm, [0, 1], prompts, [1, 0], new_tokens=12)
    assert got[0] == greedy_reference(merged_reference(checkpoint, adapter), prompts[0], 12)
    assert got[1] == greedy_reference(merged_reference(checkpoint, None), prompts[1], 12)
    with_adapter, without = (lm.prefill([0], prompts[:1], adapters=[a]) for a in (1, 0))
    assert (with_adapter - without).abs().max() > 1e-2  # the adapter changes the logits
