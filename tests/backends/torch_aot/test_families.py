"""Qwen3 and Gemma 3 through compiled artifacts (AOTInductor graphs calling neuronpack's kernels, built by the
pipeline): greedy tokens equal transformers' ``generate`` on the checkpoints transformers itself wrote, tied and
untied, with prompts prefilled together (right padded) and decoded together at different positions.
"""

from __future__ import annotations

import pytest
import transformers

from neuronpack.backends.torch_aot import load_artifact
from tests.backends.torch_aot.test_generate import PROMPT_LENGTHS, greedy_batch, hf_greedy, random_prompts
from tests.helpers.tiny_models import GEMMA3_WINDOW

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["qwen3", "qwen3-tied"])
def test_qwen3_greedy_matches_transformers(family_artifact, name):
    art = family_artifact(name)
    lm = load_artifact(art.path)
    assert lm.compiler == "aoti" and lm.config.model_type == "qwen3"
    reference = transformers.AutoModelForCausalLM.from_pretrained(art.checkpoint).eval()
    assert reference.config.tie_word_embeddings is (name == "qwen3-tied")
    prompts = random_prompts(PROMPT_LENGTHS, seed=1)
    for prompt, tokens in zip(prompts, greedy_batch(lm, prompts), strict=True):
        assert tokens == hf_greedy(reference, prompt), f"{name}: prompt of {len(prompt)} tokens diverged"


def test_gemma3_greedy_matches_transformers(family_artifact):
    """Prompts of 5, 15 and 40 tokens and 64 new ones over a window of 8: the sliding layers keep rings of 11
    positions (the window + the artifact's speculation length), the global layer every position."""
    art = family_artifact("gemma3")
    lm = load_artifact(art.path)
    assert lm.compiler == "aoti" and lm.config.kv_ring == GEMMA3_WINDOW + 3 and lm.kv_window == GEMMA3_WINDOW
    reference = transformers.AutoModelForCausalLM.from_pretrained(art.checkpoint).eval()
    prompts = random_prompts(PROMPT_LENGTHS, seed=2)
    for prompt, tokens in zip(prompts, greedy_batch(lm, prompts), strict=True):
        assert tokens == hf_greedy(reference, prompt), f"gemma3: prompt of {len(prompt)} tokens diverged"

