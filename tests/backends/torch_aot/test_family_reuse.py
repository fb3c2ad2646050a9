"""Graph reuse across fine-tunes for Gemma 3: a fine-tune built where the shared Gemma 3 artifact was takes its
AOTInductor graphs (the graph key holds what reaches a graph: config.json, the rings' length through the recipe's
speculation, the families' code) and generates the fine-tune's own greedy tokens, not the donor's."""

from __future__ import annotations

import pytest
import transformers

from neuronpack.backends.torch_aot import load_artifact
from tests.backends.torch_aot.test_generate import greedy_batch, hf_greedy, random_prompts

pytestmark = pytest.mark.slow


def test_a_gemma3_fine_tune_reuses_the_graphs_and_generates_its_own_tokens(family_artifact, tmp_path):
    from neuronpack.pipeline import compile_model
    from tests.helpers.tiny_models import fine_tune_copy
    from tests.runtime.serving import RECIPE, SERVE_OVERRIDES

    art = family_artifact("gemma3")
    tuned = fine_tune_copy(art.checkpoint, tmp_path / "fine-tune", scale=1.2, seed=7)
    reused = compile_model(str(tuned), recipe=RECIPE, overrides=[*SERVE_OVERRIDES, *art.overrides],
                           out_root=art.out_root)
    assert reused.graphs_from is not None and reused.graphs_from["key"] == art.path.name
    prompts = random_prompts((5, 40), seed=3)
    new, old = (transformers.AutoModelForCausalLM.from_pretrained(p).eval() for p in (tuned, art.checkpoint))
    expected = [hf_greedy(new, p, 24) for p in prompts]
    assert expected != [hf_greedy(old, p, 24) for p in prompts]  # the fine-tune answers differently
    assert greedy_batch(load_artifact(reused.path), prompts, 24) == expected
